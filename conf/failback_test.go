package conf

import (
	"strings"
	"testing"
	"time"
)

// TestFailback: failback takes never, manual and after:DURATION on a
// first service, defaults to "" (back to the first backend at once), and
// is refused with its line on any other scheduler or with a bad value.
func TestFailback(t *testing.T) {
	const head = "[services.s]\nlisten = [\"127.0.0.1:1\"]\nbackends = [{address = \"127.0.0.1:2\"}]\n"
	for _, tt := range []struct {
		src   string
		mode  Failback
		after time.Duration
	}{
		{"scheduler = \"first\"\n", "", 0},
		{"scheduler = \"first\"\nfailback = \"never\"\n", "never", 0},
		{"scheduler = \"first\"\nfailback = \"manual\"\n", "manual", 0},
		{"scheduler = \"first\"\nfailback = \"after:2s\"\n", "after", 2 * time.Second},
	} {
		cfg, err := Parse("f.toml", []byte(head+tt.src))
		if err != nil {
			t.Fatalf("%q: %v", tt.src, err)
		}
		if s := cfg.Services[0]; s.Failback != tt.mode || s.FailbackAfter != tt.after {
			t.Errorf("%q: failback %q after %v; want %q after %v", tt.src, s.Failback, s.FailbackAfter, tt.mode, tt.after)
		}
		var sum strings.Builder
		cfg.WriteSummary(&sum)
		if want := map[Failback]string{"": "scheduler first  listen", "never": "scheduler first (failback never)",
			"manual": "scheduler first (failback manual)", "after": "scheduler first (failback after:2s)"}[tt.mode]; !strings.Contains(sum.String(), want) {
			t.Errorf("%q: summary\n%s\nwant %q", tt.src, sum.String(), want)
		}
	}
	for _, tt := range []struct{ src, want string }{
		{"failback = \"never\"\n", `f.toml:4: services.s.failback: needs scheduler = "first" (the one writer it keeps); have scheduler = "wrr"`},
		{"scheduler = \"lc\"\nfailback = \"manual\"\n", `f.toml:5: services.s.failback: needs scheduler = "first"`},
		{"scheduler = \"first\"\nfailback = \"always\"\n", `f.toml:5: services.s.failback: "always" is not one of never, manual, after:DURATION`},
		{"scheduler = \"first\"\nfailback = \"after:soon\"\n", `f.toml:5: services.s.failback: "after:soon": after: needs a positive duration`},
		{"scheduler = \"first\"\nfailback = \"after:0s\"\n", `f.toml:5: services.s.failback: "after:0s": after: needs a positive duration`},
		{"[defaults]\nfailback = \"never\"\n", `defaults.failback: unknown key`},
	} {
		_, err := Parse("f.toml", []byte(head+tt.src))
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%q: Parse = %v; want %s", tt.src, err, tt.want)
		}
	}
}
