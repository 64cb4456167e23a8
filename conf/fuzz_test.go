package conf

import (
	"errors"
	"os"
	"strings"
	"testing"
)

// FuzzParse: the parser never panics, and every rejection is located: each
// problem is an *Error naming the file and a line or a key.
//
//	go test -run '^$' -fuzz '^FuzzParse$' -fuzztime 30s ./conf/
func FuzzParse(f *testing.F) {
	for _, p := range []string{"../systemd/fulcrum.toml", "../demo.toml"} {
		if b, err := os.ReadFile(p); err == nil {
			f.Add(b)
		}
	}
	f.Add([]byte(sample))
	f.Add([]byte("[services.s]\nlisten = [\"127.0.0.1:1\"]\nbackends = [{address = \"127.0.0.1:2\", health = {check = \"http\", path = \"/x\"}}]\n"))
	f.Add([]byte("[a.b]\n[[a.b.c]]\nx = { y = [1, {z = 2}] }\n\"q.k\" = '''\nml\n'''\n"))
	// Nesting at and past MaxDepth, and brackets in strings and comments.
	f.Add([]byte("x = " + strings.Repeat("[{a=", MaxDepth/2) + "1" + strings.Repeat("}]", MaxDepth/2) + "\n"))
	f.Add([]byte("[" + strings.Repeat("a.\"[\".", MaxDepth) + "b]\ny = '[[[' # [[[\nz = \"\"\"\n[[[\\\"\"\"\"\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		cfg, err := Parse("fuzz.toml", data)
		if err == nil {
			if cfg == nil || len(cfg.Services) == 0 {
				t.Fatalf("Parse accepted a file with no services: %+v", cfg)
			}
			return
		}
		var errs []error
		if j, ok := err.(interface{ Unwrap() []error }); ok {
			errs = j.Unwrap()
		} else {
			errs = []error{err}
		}
		for _, e := range errs {
			var ce *Error
			if !errors.As(e, &ce) || ce.File != "fuzz.toml" || (ce.Line == 0 && ce.Key == "") {
				t.Fatalf("unlocated rejection %q (%T)", e, e)
			}
		}
	})
}
