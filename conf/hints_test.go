package conf

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestHints: the names other balancers and databases use are answered
// with fulcrum's, and a password written into the file is sent to
// password_file.
func TestHints(t *testing.T) {
	base := "[services.s]\nlisten = [\"127.0.0.1:1\"]\nbackends = [{address = \"127.0.0.1:2\"}]\n"
	pw := filepath.Join(t.TempDir(), "pw")
	os.WriteFile(pw, []byte("secret\n"), 0o600)
	for _, tc := range []struct{ name, src, want string }{
		{"haproxy leastconn", base + "scheduler = \"leastconn\"\n", `"leastconn" is not one of rr, wrr, swrr, random, wrandom, lc, wlc, sed, nq, p2c, sh, mh, first (did you mean "wlc"? HAProxy's leastconn weighs its servers`},
		{"nginx least_conn", base + "scheduler = \"least_conn\"\n", `(did you mean "wlc"? nginx's least_conn`},
		{"haproxy roundrobin", base + "scheduler = \"roundrobin\"\n", `(did you mean "swrr"?`},
		{"upper case", base + "scheduler = \"WLC\"\n", `(did you mean "wlc"? names are lower case)`},
		{"typo", base + "scheduler = \"wlcc\"\n", `(did you mean "wlc"?)`},
		{"master", base + "[services.s.health]\ncheck = \"pgsql\"\nrole = \"master\"\n", `"master" is not one of any, primary, replica, galera (did you mean "primary"?)`},
		{"postgres", base + "[services.s.health]\ncheck = \"postgres\"\n", `(did you mean "pgsql"?)`},
		{"password", base + "[services.s.health]\ncheck = \"pgsql\"\npassword = \"secret\"\n", `services.s.health.password: unknown key: passwords go in password_file`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse("f.toml", []byte(tc.src))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Parse: %v; want %q in it", err, tc.want)
			}
		})
	}
}

// TestWarnings: an unweighted scheduler over unequal weights, and a
// password file others can read, are valid and warned about.
func TestWarnings(t *testing.T) {
	dir := t.TempDir()
	open := filepath.Join(dir, "open.pw")
	os.WriteFile(open, []byte("secret\n"), 0o644)
	os.Chmod(open, 0o644)
	closed := filepath.Join(dir, "closed.pw")
	os.WriteFile(closed, []byte("secret\n"), 0o600)
	svc := func(name, sched, pwfile string, weights ...string) string {
		s := "[services." + name + "]\nlisten = [\"127.0.0." + name[1:] + ":1\"]\nscheduler = \"" + sched + "\"\n"
		if pwfile != "" {
			s += "[services." + name + ".health]\ncheck = \"pgsql\"\npassword_file = \"" + pwfile + "\"\n"
		}
		for i, w := range weights {
			s += "[[services." + name + ".backends]]\naddress = \"127.0.0.1:" + string(rune('2'+i)) + "\"\nweight = " + w + "\n"
		}
		return s
	}
	src := svc("s1", "lc", "", "3", "1") + svc("s2", "wlc", "", "3", "1") + svc("s3", "rr", "", "2", "2", "0") +
		svc("s4", "random", open, "1", "1") + svc("s5", "wrr", closed, "1")
	cfg, err := Parse(filepath.Join(dir, "f.toml"), []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	got := cfg.Warnings()
	if len(got) != 2 {
		t.Fatalf("warnings %q; want 2 (s1's weights under lc, open.pw)", got)
	}
	if !strings.HasPrefix(got[0], `services.s1: scheduler "lc" ignores weights, and its backends have different weights (3, 1); use "wlc"`) {
		t.Errorf("warning %q; want s1's lc named with wlc", got[0])
	}
	if !strings.Contains(got[1], open+" is readable by others (mode 0644)") {
		t.Errorf("warning %q; want open.pw named as readable by others", got[1])
	}
}

// TestCredentialsDirectory: password_file may name a file that systemd's
// LoadCredential= put in $CREDENTIALS_DIRECTORY, and says so when that is
// not set.
func TestCredentialsDirectory(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "pg.pw"), []byte("secret\n"), 0o400)
	src := "[services.s]\nlisten = [\"127.0.0.1:1\"]\n[services.s.health]\ncheck = \"pgsql\"\npassword_file = \"$CREDENTIALS_DIRECTORY/pg.pw\"\n[[services.s.backends]]\naddress = \"127.0.0.1:2\"\n"
	t.Setenv("CREDENTIALS_DIRECTORY", dir)
	cfg, err := Parse("/etc/fulcrum/f.toml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := cfg.Services[0].Backends[0].Health.PasswordFile, filepath.Join(dir, "pg.pw"); got != want {
		t.Errorf("password_file resolved to %q; want %q", got, want)
	}
	t.Setenv("CREDENTIALS_DIRECTORY", "")
	if _, err := Parse("/etc/fulcrum/f.toml", []byte(src)); err == nil || !strings.Contains(err.Error(), "names $CREDENTIALS_DIRECTORY, which is not set") {
		t.Errorf("Parse without CREDENTIALS_DIRECTORY: %v; want it named", err)
	}
}

// TestSummaryFailover: -check's summary shows what a database recipe
// sets: the checks, roles, max_lag, fallback, hold_timeout, on_down and
// [admin].
func TestSummaryFailover(t *testing.T) {
	src := `[admin]
listen = "127.0.0.1:9900"
[services.rw]
listen = ["127.0.0.1:15432"]
scheduler = "first"
hold_timeout = "10s"
on_down = "close"
health = { check = "pgsql", role = "primary", interval = "1s" }
backends = [{ name = "pg1", address = "127.0.0.1:5432" }]
[services.ro]
listen = ["127.0.0.1:15433"]
scheduler = "wlc"
fallback = "rw"
health = { check = "pgsql", role = "replica", max_lag = "10s" }
backends = [{ name = "pg2", address = "127.0.0.1:5433" }, { name = "pg3", address = "127.0.0.1:5434", health = { max_lag = "30s" } }]
`
	cfg, err := Parse("f.toml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	cfg.WriteSummary(&b)
	for _, want := range []string{
		"admin: listen 127.0.0.1:9900",
		"hold_timeout 10s  on_down close  split_brain refuse",
		"health: pgsql every 1s (timeout 1s, rise 2, fall 3), role primary, user fulcrum",
		"fallback rw  on_down keep",
		"role replica, max_lag 10s",
		"health: max_lag 30s",
	} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("summary lacks %q:\n%s", want, b.String())
		}
	}
}
