package admin

import (
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestWriterEndpoint: POST /backends/S/B/writer (`fulcrum set S/B writer`)
// goes to Promote with who asked, says whether the writer changed, answers
// 409 with Promote's reason, 403 cross-origin, and 404 without Promote.
func TestWriterEndpoint(t *testing.T) {
	var by []string
	src := emptySource()
	src.Promote = func(svc, name, who string) (bool, error) {
		if name == "down" {
			return false, errors.New("db/down is not up")
		}
		by = append(by, svc+"/"+name+" "+who)
		return len(by) == 1, nil
	}
	srv := httptest.NewServer(Handler(src))
	defer srv.Close()
	post := func(path string, header ...string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest("POST", srv.URL+path, nil)
		for i := 0; i+1 < len(header); i += 2 {
			req.Header.Set(header[i], header[i+1])
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	for _, tc := range []struct {
		path   string
		header []string
		code   int
		body   string
	}{
		{"/backends/db/a/writer", nil, 200, "db/a now the writer"},
		{"/backends/db/a/writer", nil, 200, "db/a already the writer"},
		{"/backends/db/down/writer", nil, 409, "db/down is not up"},
		{"/backends/db/a/writer", []string{"Sec-Fetch-Site", "cross-site"}, 403, ""},
		{"/backends/db/a/writer", []string{"X-Fulcrum-Console", "1"}, 200, "db/a already the writer"},
	} {
		code, body := post(tc.path, tc.header...)
		if code != tc.code || !strings.Contains(body, tc.body) {
			t.Errorf("POST %s = %d %q; want %d %q", tc.path, code, body, tc.code, tc.body)
		}
	}
	if len(by) != 3 || !strings.HasPrefix(by[0], "db/a POST /backends/db/a/writer from 127.0.0.1:") ||
		!strings.HasPrefix(by[2], "db/a console: POST /backends/db/a/writer from 127.0.0.1:") {
		t.Errorf("Promote calls %q; want three for db/a, by the request, the last by the console", by)
	}
	src.Promote = nil
	srv2 := httptest.NewServer(Handler(src))
	defer srv2.Close()
	if resp, err := http.Post(srv2.URL+"/backends/db/a/writer", "", nil); err != nil || resp.StatusCode != 404 {
		t.Errorf("without Promote: %v, %v; want 404", resp, err)
	} else {
		resp.Body.Close()
	}
}
