package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"fulcrum/internal/testkit"
)

// browser starts headless Chromium (Debian's chromium, which .ci/run
// installs) with a fresh profile and the flags that keep it off the
// network, and returns a context for chromedp actions. The test's cleanup
// ends the browser.
func browser(t *testing.T) context.Context {
	t.Helper()
	exe := needProgram(t, "chromium")
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(exe),
		chromedp.Flag("headless", true),
		chromedp.Flag("no-sandbox", true), // as root in a container: the sandbox needs user namespaces
		chromedp.Flag("disable-gpu", true),
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("no-first-run", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1400, 1000),
	}
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(actx)
	t.Cleanup(func() { cancel(); cancelAlloc() })
	// The first run starts the browser, which lives as long as that run's
	// context: ctx itself, not one with a deadline.
	if err := chromedp.Do(ctx); err != nil {
		t.Fatalf("start chromium: %v", err)
	}
	return ctx
}

// run runs chromedp actions with a deadline.
func run(t *testing.T, ctx context.Context, within time.Duration, what string, actions ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	c, cancel := context.WithTimeout(ctx, within)
	defer cancel()
	if err := chromedp.Do(c, actions...); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// value runs one chromedp action that returns a value, with a deadline.
func value[T any](t *testing.T, ctx context.Context, within time.Duration, what string, a chromedp.Action[T]) T {
	t.Helper()
	c, cancel := context.WithTimeout(ctx, within)
	defer cancel()
	v, err := chromedp.Run(c, a)
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	return v
}

// backendState reads one backend's state and override from /status.
func backendState(t *testing.T, adm, service, name string) (state, override string) {
	t.Helper()
	resp, err := http.Get("http://" + adm + "/status")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var st struct {
		Services []struct {
			Name     string `json:"name"`
			Backends []struct {
				Name     string `json:"name"`
				State    string `json:"state"`
				Override string `json:"override"`
			} `json:"backends"`
		} `json:"services"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		t.Fatal(err)
	}
	for _, s := range st.Services {
		for _, b := range s.Backends {
			if s.Name == service && b.Name == name {
				return b.State, b.Override
			}
		}
	}
	t.Fatalf("no backend %s/%s in /status", service, name)
	return "", ""
}

// TestConsole opens the admin listener's web console in a real headless
// Chromium: every backend is shown with its state; a backend killed turns
// red within its check interval and the page's refresh; a drain asked for
// from the page (and confirmed) reaches /status and the log with who asked;
// a POST from a page of another origin is refused and changes nothing; and
// on a phone's width the page needs no sideways scrolling. With
// FULCRUM_CONSOLE_SCREENSHOT=1 it writes docs/console.png for the README.
func TestConsole(t *testing.T) {
	ctx := browser(t)
	a := testkit.NewServer(t, testkit.Greeter("a"))
	b := testkit.NewServer(t, testkit.Greeter("b"))
	c := testkit.NewServer(t, testkit.Greeter("c"))
	const interval = time.Second
	d := startDaemon(t, fmt.Sprintf(`
[log]
format = "json"
[admin]
listen = "127.0.0.1:0"
[defaults.health]
check    = "tcp"
interval = %q
timeout  = "500ms"
rise     = 1
fall     = 1
[services.web]
listen    = ["127.0.0.1:0"]
scheduler = "wlc"
max_conns = 100
backends  = [
  { name = "a", address = %q, weight = 2, max_conns = 50 },
  { name = "b", address = %q },
  { name = "c", address = %q },
]
[services.ro]
listen    = ["127.0.0.2:0"]
scheduler = "wlc"
fallback  = "web"
backends  = [{ name = "replica", address = %q }]
`, interval, a.Addr, b.Addr, c.Addr, testkit.DeadAddr(t)))
	adm := d.adminAddr(t)
	web := d.listenAddr(t)
	for range 6 { // some traffic for the counters and plots
		greet(t, web)
	}
	url := "http://" + adm + "/"
	run(t, ctx, 30*time.Second, "open the console",
		chromedp.Navigate(url),
		chromedp.WaitVisible(chromedp.CSS(`tr[data-backend="web/a"][data-state="up"]`)),
		chromedp.WaitVisible(chromedp.CSS(`tr[data-backend="web/c"][data-state="up"]`)),
		chromedp.WaitVisible(chromedp.CSS(`tr[data-backend="ro/replica"][data-state="down"]`)),
		chromedp.WaitVisible(chromedp.CSS(`article[data-service="ro"][data-serving="fallback"]`)),
	)
	active := value(t, ctx, 10*time.Second, "read web's connections",
		chromedp.Evaluate[string](`document.querySelector('article[data-service="web"] [data-active]').textContent`))
	if !strings.HasSuffix(active, " / 100") {
		t.Errorf("web's connections read %q on the page; want them with its max_conns, \"N / 100\"", active)
	}
	colour := value(t, ctx, 10*time.Second, "read a down badge's colour",
		chromedp.Evaluate[string](`getComputedStyle(document.querySelector('tr[data-backend="ro/replica"] .badge')).backgroundColor`))
	if colour != "rgb(207, 34, 46)" {
		t.Errorf("a down backend's badge is %s; want red, rgb(207, 34, 46)", colour)
	}

	// A backend killed turns red: its next check (within interval, ±10%)
	// finds it, and the page's next refresh (every second) shows it.
	a.Close()
	killed := time.Now()
	run(t, ctx, 20*time.Second, "web/a shown down after its kill",
		chromedp.WaitVisible(chromedp.CSS(`tr[data-backend="web/a"][data-state="down"]`)))
	took := time.Since(killed)
	t.Logf("web/a red on the page %v after its kill (check interval %v, page refresh 1s)", took.Round(10*time.Millisecond), interval)
	if limit := interval*11/10 + time.Second + 2*time.Second; took > limit { // the check, the refresh, and room for a busy machine
		t.Errorf("web/a turned red %v after its kill; want within %v", took, limit)
	}

	// A drain from the page, confirmed, reaches /status and the log.
	run(t, ctx, 20*time.Second, "drain web/b from the page",
		chromedp.Click(chromedp.CSS(`tr[data-backend="web/b"] button[data-state="drain"]`)),
		chromedp.WaitVisible(chromedp.CSS(`#confirm-yes`)),
		chromedp.Click(chromedp.CSS(`#confirm-yes`)),
		chromedp.WaitVisible(chromedp.CSS(`tr[data-backend="web/b"][data-override="drain"]`)),
	)
	if state, o := backendState(t, adm, "web", "b"); state != "draining" || o != "drain" {
		t.Errorf("after the page's drain /status has web/b %s, override %q; want draining, drain", state, o)
	}
	line := d.await(t, "backend override set")
	if by, _ := line["by"].(string); line["backend"] != "b" || !strings.HasPrefix(by, "console: POST /backends/web/b/drain from 127.0.0.1:") {
		t.Errorf("override line %v; want web/b's drain, by the console with its address", line)
	}

	// A page of another origin that posts to the admin listener is refused.
	evil := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html")
		fmt.Fprintf(w, `<!doctype html><form id=f method=POST action="http://%s/backends/web/c/maint"></form><script>document.getElementById("f").submit()</script>`, adm)
	})}
	eln, err := net.Listen("tcp", "127.0.0.3:0")
	if err != nil {
		t.Fatal(err)
	}
	go evil.Serve(eln) // exits when the cleanup closes it
	t.Cleanup(func() { evil.Close() })
	run(t, ctx, 20*time.Second, "a cross-origin form POST",
		chromedp.Navigate("http://"+eln.Addr().String()+"/"),
		chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
			_, err := chromedp.Poll[bool](`location.host === "`+adm+`" && document.body && document.body.innerText.length > 0`,
				chromedp.WithPollingTimeout(15*time.Second))(ctx, tg)
			return err
		}),
	)
	body := value(t, ctx, 10*time.Second, "read the answer", chromedp.Evaluate[string](`document.body.innerText`))
	if !strings.Contains(strings.ToLower(body), "cross-origin") {
		t.Errorf("the cross-origin POST was answered %q; want it refused as cross-origin", body)
	}
	if _, o := backendState(t, adm, "web", "c"); o != "" {
		t.Errorf("after a cross-origin POST web/c has override %q; want none", o)
	}

	// The page again, for the events and the plots, and a screenshot.
	run(t, ctx, 30*time.Second, "the console after it all",
		chromedp.Navigate(url),
		chromedp.WaitVisible(chromedp.CSS(`tr[data-backend="web/b"][data-override="drain"]`)),
		chromedp.WaitVisible(chromedp.CSS(`#events li[data-seq]`)),
	)
	events := value(t, ctx, 10*time.Second, "read the events", chromedp.Evaluate[string](`document.getElementById("events").innerText`))
	for _, want := range []string{"web/a", "up → down", "web/b", "set ready → set drain"} {
		if !strings.Contains(events, want) {
			t.Errorf("the events timeline lacks %q:\n%s", want, events)
		}
	}
	for range 3 {
		greet(t, web)
	}
	run(t, ctx, 30*time.Second, "the plots drawn from /history",
		chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
			_, err := chromedp.Poll[bool](`[...document.querySelectorAll("svg.spark polyline")].some(p => p.getAttribute("points").split(" ").length > 3)`,
				chromedp.WithPollingTimeout(25*time.Second))(ctx, tg)
			return err
		}),
	)
	var hist struct {
		Series map[string]struct {
			LatencyMS []*float64 `json:"latency_ms"`
		} `json:"series"`
	}
	if resp, err := http.Get("http://" + adm + "/history"); err != nil {
		t.Error(err)
	} else {
		err := json.NewDecoder(resp.Body).Decode(&hist)
		resp.Body.Close()
		if lat := hist.Series["web/c"].LatencyMS; err != nil || len(lat) == 0 || lat[len(lat)-1] == nil {
			t.Errorf("/history: web/c's check latency %v (%v); want its last check's", lat, err)
		}
	}
	shot := value(t, ctx, 20*time.Second, "a screenshot", chromedp.FullScreenshot(100))
	out := filepath.Join(t.TempDir(), "console.png")
	if os.Getenv("FULCRUM_CONSOLE_SCREENSHOT") == "1" {
		out = "../../docs/console.png"
	}
	if err := os.WriteFile(out, shot, 0o644); err != nil {
		t.Fatal(err)
	}

	// On a phone's width: no sideways scrolling.
	run(t, ctx, 20*time.Second, "the console on a phone",
		chromedp.EmulateViewport(390, 844),
		chromedp.Navigate(url),
		chromedp.WaitVisible(chromedp.CSS(`tr[data-backend="web/c"]`)),
	)
	overflow := value(t, ctx, 10*time.Second, "measure the page", chromedp.Evaluate[bool](`document.documentElement.scrollWidth > window.innerWidth + 1`))
	if overflow {
		t.Error("on a 390 px wide screen the console scrolls sideways")
	}
	if p := os.Getenv("FULCRUM_CONSOLE_PHONE"); p != "" { // to look at by hand
		os.WriteFile(p, value(t, ctx, 20*time.Second, "a phone screenshot", chromedp.FullScreenshot(100)), 0o644)
	}
}
