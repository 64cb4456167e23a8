package admin

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"fulcrum/internal/testkit"
	"fulcrum/listener"
)

// TestHealthzStuckAtLimit: /healthz fails while every slot of the
// connection limit is held and no connection is accepted for limitStall,
// and passes again as soon as one is; a stalled log output is said but
// fails nothing; fulcrum_log_dropped_total counts the drops.
func TestHealthzStuckAtLimit(t *testing.T) {
	defer func(d time.Duration) { limitStall = d }(limitStall)
	limitStall = 300 * time.Millisecond
	var open, accepts, dropped atomic.Int64
	var stalled atomic.Bool
	src := emptySource()
	src.Limit = func() listener.LimitStats { return listener.LimitStats{Open: int(open.Load()), Max: 10} }
	src.Sockets = func() []listener.SocketStats {
		return []listener.SocketStats{{Accepts: uint64(accepts.Load())}, {Accepts: 1}}
	}
	src.Log = func() (uint64, bool) { return uint64(dropped.Load()), stalled.Load() }
	srv := httptest.NewServer(Handler(src))
	defer srv.Close()
	get := func(path string) (int, string) {
		t.Helper()
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	// awaitHealthz polls until /healthz answers code, for at most 10 s.
	awaitHealthz := func(code int) string {
		t.Helper()
		var body string
		testkit.WaitFor(t, 10*time.Second, func() error {
			var c int
			if c, body = get("/healthz"); c != code {
				return fmt.Errorf("/healthz = %d %q; want %d", c, body, code)
			}
			return nil
		})
		return body
	}

	open.Store(10) // at the limit, and nothing accepted from now on
	start := time.Now()
	if c, body := get("/healthz"); c != 200 {
		t.Fatalf("/healthz at the limit, at once = %d %q; want 200 (busy is not stuck)", c, body)
	}
	body := awaitHealthz(503)
	if d := time.Since(start); d < limitStall {
		t.Errorf("/healthz failed after %v; want at least %v", d, limitStall)
	}
	if !strings.Contains(body, "connection limit reached (10 of 10) and no connection accepted for") {
		t.Errorf("/healthz said %q", body)
	}

	accepts.Add(1) // one got in: progress, busy again
	if c, body := get("/healthz"); c != 200 {
		t.Errorf("/healthz after an accept = %d %q; want 200", c, body)
	}
	awaitHealthz(503)
	open.Store(9) // below the limit
	if c, body := get("/healthz"); c != 200 {
		t.Errorf("/healthz below the limit = %d %q; want 200", c, body)
	}

	dropped.Store(1234)
	stalled.Store(true)
	if c, body := get("/healthz"); c != 200 || body != "ok; log output stalled: 1234 lines dropped\n" {
		t.Errorf("/healthz with a stalled log = %d %q; want 200 saying so", c, body)
	}
	if _, m := get("/metrics"); !strings.Contains(m, "fulcrum_log_dropped_total 1234\n") {
		t.Errorf("metrics: %q; want fulcrum_log_dropped_total 1234", grepLines(m, "fulcrum_log"))
	}
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
