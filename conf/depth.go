package conf

import "fmt"

// MaxDepth is how deeply a configuration file may nest: table headers and
// dotted keys count one level per part ([[a.b]] two, and one more for the
// array of tables), and each array or inline table one more. fulcrum's own
// schema needs 6 ([[services.NAME.backends]] with a health = {…} table);
// 32 leaves room for any layout of it.
//
// The bound is not about style: the TOML decoder's cost grows with the
// square of the depth (a 40 KB file of nested inline tables takes more than
// 4 GB, a 10 MB one of nested arrays overflows its stack, which no recover
// catches), and a reload parses in the daemon. checkDepth refuses such a
// file before the decoder sees it.
const MaxDepth = 32

// checkDepth scans data once, in linear time and constant memory besides a
// stack of at most MaxDepth+1 entries, and returns a located error at the
// first place nested deeper than MaxDepth, or nil. It skips strings and
// comments (a "[" in either is not nesting) and knows where a key stands
// (the start of a line, after "{" and after "," in an inline table). It
// need not validate: on a file that is not TOML it only has to stay linear
// and find no depth the decoder would not reach before its first error.
func checkDepth(name string, data []byte) *Error {
	s := &depthScanner{src: data, line: 1}
	type frame struct {
		table bool // an inline table: its entries are key = value
		level int  // its own level
	}
	var stack []frame
	base := 0 // the level of the current [table]
	deeper := func(level int) *Error {
		if level <= MaxDepth {
			return nil
		}
		return &Error{File: name, Line: s.line, Msg: fmt.Sprintf("nested deeper than %d levels (table headers and dotted keys count a level per part, arrays and inline tables one each): refused before parsing", MaxDepth)}
	}
	// open reads a value at level; an array or inline table is pushed.
	open := func(level int) *Error {
		s.blank(false)
		switch s.peek() {
		case '[', '{':
			if err := deeper(level); err != nil {
				return err
			}
			stack = append(stack, frame{table: s.next() == '{', level: level})
		case '"', '\'':
			s.str()
		default:
			s.scalar()
		}
		return nil
	}
	for {
		if len(stack) == 0 {
			s.blank(true)
			if s.eof() {
				return nil
			}
			start := s.i
			if s.peek() == '[' { // [table] or [[array of tables]]
				s.next()
				level := 0
				if s.peek() == '[' {
					s.next()
					level++
				}
				level += s.key()
				if err := deeper(level); err != nil {
					return err
				}
				base = level
				s.rest()
				continue
			}
			level := base + s.key()
			if err := deeper(level); err != nil {
				return err
			}
			s.blank(false)
			if s.peek() == '=' {
				s.next()
			}
			if err := open(level); err != nil {
				return err
			}
			if len(stack) == 0 {
				s.rest()
			}
			if s.i == start { // not TOML: step over the byte, as the decoder stops here anyway
				s.next()
			}
			continue
		}
		s.blank(true)
		if s.eof() {
			return nil
		}
		top := stack[len(stack)-1]
		start := s.i
		switch s.peek() {
		case ']', '}':
			s.next()
			stack = stack[:len(stack)-1]
			if len(stack) == 0 {
				s.rest()
			}
			continue
		case ',':
			s.next()
			continue
		}
		if top.table {
			level := top.level + s.key()
			if err := deeper(level); err != nil {
				return err
			}
			s.blank(false)
			if s.peek() == '=' {
				s.next()
			}
			if err := open(level); err != nil {
				return err
			}
		} else if err := open(top.level + 1); err != nil {
			return err
		}
		if s.i == start {
			s.next()
		}
	}
}

// depthScanner is checkDepth's cursor over the bytes, counting lines.
type depthScanner struct {
	src  []byte
	i    int
	line int
}

func (s *depthScanner) eof() bool { return s.i >= len(s.src) }

func (s *depthScanner) peek() byte {
	if s.i < len(s.src) {
		return s.src[s.i]
	}
	return 0
}

func (s *depthScanner) next() byte {
	if s.i >= len(s.src) {
		return 0
	}
	c := s.src[s.i]
	s.i++
	if c == '\n' {
		s.line++
	}
	return c
}

func (s *depthScanner) has(p string) bool {
	return len(s.src)-s.i >= len(p) && string(s.src[s.i:s.i+len(p)]) == p
}

// blank skips spaces and tabs, comments, and newlines when nl is set.
func (s *depthScanner) blank(nl bool) {
	for !s.eof() {
		switch c := s.peek(); {
		case c == ' ' || c == '\t' || c == '\r':
			s.i++
		case c == '\n' && nl:
			s.next()
		case c == '#':
			for !s.eof() && s.peek() != '\n' {
				s.i++
			}
		default:
			return
		}
	}
}

// rest skips to the end of the line: a header's closing brackets, a
// comment, or what the decoder will refuse.
func (s *depthScanner) rest() {
	for !s.eof() && s.peek() != '\n' {
		if c := s.peek(); c == '"' || c == '\'' {
			s.str()
			continue
		}
		s.i++
	}
}

// key skips a possibly dotted key and returns how many parts it has.
func (s *depthScanner) key() int {
	n := 0
	for {
		s.blank(false)
		switch c := s.peek(); {
		case c == '"' || c == '\'':
			s.str()
		case bare(c):
			for !s.eof() && bare(s.peek()) {
				s.i++
			}
		default:
			return n
		}
		n++
		s.blank(false)
		if s.peek() != '.' {
			return n
		}
		s.next()
	}
}

// bare reports whether c may be part of a bare key; lenient (any byte
// TOML gives no other meaning), since the decoder validates.
func bare(c byte) bool {
	switch c {
	case ' ', '\t', '\r', '\n', '.', '=', '[', ']', '{', '}', ',', '"', '\'', '#', 0:
		return false
	}
	return true
}

// scalar skips a number, boolean or date, up to what ends a value.
func (s *depthScanner) scalar() {
	for !s.eof() {
		switch s.peek() {
		case ',', ']', '}', '[', '{', '\n', '#', '"', '\'':
			return
		}
		s.i++
	}
}

// str skips a string of any of TOML's four kinds; an unterminated one ends
// at the line's end (one-line kinds) or the file's.
func (s *depthScanner) str() {
	q := s.peek()
	if s.has(`"""`) || s.has(`'''`) {
		delim := string([]byte{q, q, q})
		s.i += 3
		for !s.eof() {
			if s.has(delim) {
				s.i += 3
				for k := 0; k < 2 && s.peek() == q; k++ { // up to two quotes may end the content
					s.i++
				}
				return
			}
			if q == '"' && s.peek() == '\\' {
				s.next()
			}
			s.next()
		}
		return
	}
	s.next()
	for !s.eof() {
		switch c := s.peek(); {
		case c == '\n':
			return
		case c == q:
			s.next()
			return
		case c == '\\' && q == '"':
			s.next()
			if s.peek() != '\n' {
				s.next()
			}
		default:
			s.next()
		}
	}
}
