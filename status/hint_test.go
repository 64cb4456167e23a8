package status

import "testing"

// TestCredentialsHint: every backend refusing the check's login points at
// the check's credentials; one refusing, or a mix of failures, does not.
func TestCredentialsHint(t *testing.T) {
	login := &LastCheck{Error: `pgsql login as fulcrum_check: password authentication failed for user "fulcrum_check" (SQLSTATE 28P01)`}
	refused := &LastCheck{Error: "dial tcp 127.0.0.1:5432: connect: connection refused"}
	for _, tc := range []struct {
		name string
		bs   []Backend
		hint bool
	}{
		{"all refuse the login", []Backend{{LastCheck: login}, {LastCheck: login}}, true},
		{"one backend", []Backend{{LastCheck: login}}, false},
		{"one refuses, one is down", []Backend{{LastCheck: login}, {LastCheck: refused}}, false},
		{"one passes", []Backend{{LastCheck: login}, {LastCheck: &LastCheck{OK: true}}}, false},
		{"no checks", []Backend{{}, {}}, false},
	} {
		if got := credentialsHint(tc.bs) != ""; got != tc.hint {
			t.Errorf("%s: hint %v; want %v", tc.name, got, tc.hint)
		}
	}
}
