package admin

import (
	"embed"
	"mime"
	"net/http"
	"path"
	"strings"
)

// The web console: one page, its script and its style sheet, embedded so
// that it works offline, behind the Host check and without any asset from
// elsewhere. It reads /status and /history and posts what `fulcrum set`
// and `fulcrum drain` post, through the same cross-origin protection.
//
//go:embed console
var console embed.FS

// consoleCSP keeps the page to its own files: no inline script, nothing
// from another origin, and no framing (its buttons must not be clicked
// through someone else's page).
const consoleCSP = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; " +
	"base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

// serveConsole serves one of the console's files.
func serveConsole(w http.ResponseWriter, r *http.Request, name string) {
	data, err := console.ReadFile("console/" + path.Clean("/" + name)[1:])
	if err != nil {
		http.NotFound(w, r)
		return
	}
	h := w.Header()
	ct := mime.TypeByExtension(path.Ext(name))
	if ct == "" {
		ct = "application/octet-stream"
	}
	h.Set("Content-Type", ct)
	h.Set("Content-Security-Policy", consoleCSP)
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Cache-Control", "no-cache")
	w.Write(data)
}

// wantsHTML reports whether r comes from a browser (it accepts text/html);
// curl and scripts get the text index.
func wantsHTML(r *http.Request) bool {
	return strings.Contains(r.Header.Get("Accept"), "text/html")
}

// who says who asked for a change, for the log line and the state it
// sets: the request, where it came from, and whether the console sent it.
func who(r *http.Request) string {
	by := r.Method + " " + r.URL.Path + " from " + r.RemoteAddr
	if r.Header.Get("X-Fulcrum-Console") != "" {
		by = "console: " + by
	}
	return by
}

// validNames lists, after a `fulcrum set` for a name that does not exist,
// the names that do: the service's backends, or every SERVICE/BACKEND when
// the service is unknown.
func validNames(src Source, service string) string {
	if src.Snapshot == nil {
		return ""
	}
	t := src.Snapshot()
	if t == nil {
		return ""
	}
	var names []string
	if s := t.Service(service); s != nil {
		for _, tg := range s.All() {
			names = append(names, tg.B.Name)
		}
		return "; its backends: " + strings.Join(names, ", ")
	}
	for _, s := range t.Services {
		for _, tg := range s.All() {
			names = append(names, s.Name+"/"+tg.B.Name)
		}
	}
	return "; the backends: " + strings.Join(names, ", ")
}
