package conf

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"regexp"
)

// StateDamaged are the values of [admin] state_damaged: what the daemon does
// at start when the state file exists but cannot be read as one.
var StateDamaged = []StateDamage{StateDamageRefuse, StateDamageStartEmpty}

// stateHeader is how every state file fulcrum writes begins (a
// statefile.State, marshalled with its first field "fulcrum_state"; files of
// earlier releases begin with "saved"). A file that begins otherwise is not
// fulcrum's, and fulcrum must not overwrite it.
var stateHeader = regexp.MustCompile(`^\s*\{\s*"(fulcrum_state|saved)"\s*:`)

// IsStateFile reports whether head, the first bytes of a file, is how a
// state file fulcrum wrote begins. An empty file is one (it holds nothing
// to lose: `touch` may have made it).
func IsStateFile(head []byte) bool {
	return len(bytes.TrimSpace(head)) == 0 || stateHeader.Match(head)
}

// stateFile refuses a state_file that names a file fulcrum must never
// overwrite: the configuration itself, a password_file it reads, or an
// existing file that is not a state file of fulcrum's.
func (w *walker) stateFile(cfg *Config) {
	f := cfg.Admin.StateFile
	if f == "" {
		return
	}
	key := "admin.state_file"
	same := func(other string) bool {
		if filepath.Clean(other) == filepath.Clean(f) {
			return true
		}
		a, errA := os.Stat(f)
		b, errB := os.Stat(other)
		return errA == nil && errB == nil && os.SameFile(a, b)
	}
	if w.file != "" {
		if abs, err := filepath.Abs(w.file); err == nil && same(abs) {
			w.errorf(key, "%s is this configuration file: fulcrum would replace it with its state; name a file of its own, such as \"/var/lib/fulcrum/state.json\"", f)
			return
		}
	}
	for _, s := range cfg.Services {
		for _, b := range s.Backends {
			if p := b.Health.PasswordFile; p != "" && same(p) {
				w.errorf(key, "%s is the password_file of services.%s backend %s: fulcrum would replace it with its state; name a file of its own", f, s.Name, b.Name)
				return
			}
		}
	}
	fh, err := os.Open(f)
	if err != nil {
		return // missing (created at the first save) or unreadable: the daemon says so when it writes
	}
	defer fh.Close()
	if fi, err := fh.Stat(); err == nil && !fi.Mode().IsRegular() {
		w.errorf(key, "%s exists and is not a regular file", f)
		return
	}
	head := make([]byte, 256)
	n, err := io.ReadFull(fh, head)
	if err != nil && err != io.ErrUnexpectedEOF && err != io.EOF {
		return
	}
	if !IsStateFile(head[:n]) {
		w.errorf(key, "%s exists and is not a state file of fulcrum's (it does not begin with {\"fulcrum_state\": …}): fulcrum would overwrite it; name a new file, or remove this one if it is yours to lose", f)
	}
}
