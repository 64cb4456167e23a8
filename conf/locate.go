package conf

import (
	"strconv"
	"strings"
)

// locate maps every key path of a TOML document to the line (1-based) where
// the key is written: "services.pg.backends[1].weight" → 14. Tables map to
// their header's line, array-of-tables entries to their [[header]] line.
//
// BurntSushi/toml records these positions but does not export them, so this
// is a small scanner of our own. It runs only on input that toml.Decode has
// already accepted, which lets it skip values without validating them.
func locate(src string) map[string]int {
	l := &locator{src: src, line: 1, pos: map[string]int{}, arrays: map[string]int{}}
	l.document()
	return l.pos
}

type locator struct {
	src    string
	i      int
	line   int
	pos    map[string]int
	arrays map[string]int // array-of-tables path → entries seen so far
}

func (l *locator) peek() byte {
	if l.i < len(l.src) {
		return l.src[l.i]
	}
	return 0
}

func (l *locator) next() byte {
	c := l.src[l.i]
	l.i++
	if c == '\n' {
		l.line++
	}
	return c
}

// blank skips spaces and tabs, and also newlines and comments when nl is set.
func (l *locator) blank(nl bool) {
	for l.i < len(l.src) {
		switch c := l.peek(); {
		case c == ' ' || c == '\t' || c == '\r':
			l.i++
		case c == '\n' && nl:
			l.next()
		case c == '#':
			for l.i < len(l.src) && l.peek() != '\n' {
				l.i++
			}
		default:
			return
		}
	}
}

func (l *locator) record(path string) {
	if _, ok := l.pos[path]; !ok {
		l.pos[path] = l.line
	}
}

func (l *locator) document() {
	table := ""
	for {
		l.blank(true)
		if l.i >= len(l.src) {
			return
		}
		if l.peek() == '[' {
			l.next()
			array := l.peek() == '['
			if array {
				l.next()
			}
			l.blank(false)
			parts := l.keys()
			for l.i < len(l.src) && l.peek() != '\n' {
				l.i++ // the closing brackets and any comment
			}
			// Resolve the path through arrays of tables: [[a]] then [a.b]
			// or [[a.b]] means the last entry of a.
			p := ""
			for k, part := range parts {
				p = join(p, part)
				l.record(p) // a parent table is located at its first mention
				if n, ok := l.arrays[p]; ok && (k < len(parts)-1 || !array) {
					p += "[" + strconv.Itoa(n-1) + "]"
				}
			}
			if array {
				n := l.arrays[p]
				l.arrays[p] = n + 1
				p += "[" + strconv.Itoa(n) + "]"
			}
			l.record(p)
			table = p
			continue
		}
		l.keyValue(table)
	}
}

// keyValue reads `key = value` (the key possibly dotted) under prefix.
func (l *locator) keyValue(prefix string) {
	p := prefix
	for _, k := range l.keys() {
		p = join(p, k)
	}
	l.blank(false)
	if l.peek() == '=' {
		l.next()
	}
	l.blank(false)
	l.record(p)
	l.value(p)
}

// keys reads a dotted key and returns its parts.
func (l *locator) keys() []string {
	var parts []string
	for {
		l.blank(false)
		var k string
		switch l.peek() {
		case '"':
			k = l.basicString()
		case '\'':
			k = l.literalString()
		default:
			s := l.i
			for l.i < len(l.src) {
				c := l.peek()
				if c == '_' || c == '-' || c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' {
					l.i++
					continue
				}
				break
			}
			k = l.src[s:l.i]
		}
		parts = append(parts, k)
		l.blank(false)
		if l.peek() != '.' {
			return parts
		}
		l.next()
	}
}

func (l *locator) value(path string) {
	switch l.peek() {
	case '"', '\'':
		if strings.HasPrefix(l.src[l.i:], `"""`) || strings.HasPrefix(l.src[l.i:], `'''`) {
			l.multiline(l.src[l.i : l.i+3])
		} else if l.peek() == '"' {
			l.basicString()
		} else {
			l.literalString()
		}
	case '[':
		l.next()
		for n := 0; ; n++ {
			l.blank(true)
			if l.peek() == ']' || l.i >= len(l.src) {
				break
			}
			elem := path + "[" + strconv.Itoa(n) + "]"
			l.record(elem)
			l.value(elem)
			l.blank(true)
			if l.peek() == ',' {
				l.next()
			}
		}
		if l.i < len(l.src) {
			l.next()
		}
	case '{':
		l.next()
		for {
			l.blank(false)
			if l.peek() == '}' || l.i >= len(l.src) {
				break
			}
			l.keyValue(path)
			l.blank(false)
			if l.peek() == ',' {
				l.next()
			}
		}
		if l.i < len(l.src) {
			l.next()
		}
	default: // number, bool, date: runs to a delimiter
		for l.i < len(l.src) {
			switch l.peek() {
			case ',', ']', '}', '\n', '#':
				return
			}
			l.i++
		}
	}
}

func (l *locator) basicString() string {
	l.next()
	var b strings.Builder
	for l.i < len(l.src) {
		c := l.next()
		switch c {
		case '"':
			return b.String()
		case '\\':
			if l.i < len(l.src) {
				b.WriteByte(l.next())
			}
		default:
			b.WriteByte(c)
		}
	}
	return b.String()
}

func (l *locator) literalString() string {
	l.next()
	s := l.i
	for l.i < len(l.src) && l.peek() != '\'' {
		l.next()
	}
	v := l.src[s:l.i]
	if l.i < len(l.src) {
		l.next()
	}
	return v
}

func (l *locator) multiline(delim string) {
	l.i += 3
	for l.i < len(l.src) {
		if strings.HasPrefix(l.src[l.i:], delim) {
			l.i += 3
			for l.peek() == delim[0] { // up to two quotes may end the content
				l.i++
			}
			return
		}
		if delim[0] == '"' && l.peek() == '\\' {
			l.next()
		}
		if l.i < len(l.src) {
			l.next()
		}
	}
}

// join appends key to a dotted path. An empty key (`"" = 1` is valid TOML)
// is spelled "" so that it still names something.
func join(prefix, key string) string {
	if key == "" {
		key = `""`
	}
	if prefix == "" {
		return key
	}
	return prefix + "." + key
}
