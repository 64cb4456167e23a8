package reload

import (
	"bytes"
	"context"
	"strings"
	"sync"
	"testing"

	"fulcrum/conf"
	"fulcrum/listener"

	"github.com/rs/zerolog"
)

// lockedBuffer is a log sink the Manager's goroutines may share.
type lockedBuffer struct {
	mu sync.Mutex // protects b
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestApplyWarnsProcessAtRestart: [process] is read at start (the event
// loops start once); a reload that changes it applies the rest and says
// the loops stay as they are.
func TestApplyWarnsProcessAtRestart(t *testing.T) {
	var logs lockedBuffer
	log := zerolog.New(&logs)
	srv := listener.New(log)
	m := New("", srv, log, Options{})
	t.Cleanup(func() { m.Shutdown(context.Background()) })
	parse := func(src string) *conf.Config {
		t.Helper()
		cfg, err := conf.Parse("test.toml", []byte(src+"[services.s]\nlisten = [\"127.0.0.1:0\"]\nbackends = [{ address = \"127.0.0.1:1\" }]\n"))
		if err != nil {
			t.Fatal(err)
		}
		return cfg
	}
	if err := m.Apply(parse("")); err != nil {
		t.Fatal(err)
	}
	if err := m.Apply(parse("[process]\nloops = 2\n")); err != nil {
		t.Fatal(err)
	}
	if out := logs.String(); !strings.Contains(out, "[process] changes only at restart") || !strings.Contains(out, `"file":2`) {
		t.Errorf("a reload that changes [process] loops logged\n%s\nwant a warning that it changes only at restart", out)
	}
	if g := srv.Snapshot().Gen; g != 2 {
		t.Errorf("gen = %d; want 2: the rest of the file applies", g)
	}
}
