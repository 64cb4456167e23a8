package conf

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"
)

// valid is a whole file that Parse accepts; the nesting tests add to it.
const valid = "[services.s]\nlisten = [\"127.0.0.1:7001\"]\nbackends = [{address = \"127.0.0.1:7002\"}]\n"

// TestDepthRefused: a file nested deeper than MaxDepth, in each of TOML's
// ways to nest, is refused before it is decoded, with the line where it
// goes too deep.
func TestDepthRefused(t *testing.T) {
	const n = 200 // deep enough to refuse, cheap for the decoder should it run
	dotted := strings.Repeat("a.", n) + "a"
	tests := []struct {
		name, src string
		line      int
	}{
		{"arrays", valid + "[x]\ny = " + strings.Repeat("[", n) + strings.Repeat("]", n) + "\n", 5},
		{"inline tables", valid + "[x]\ny = " + strings.Repeat("{a=", n) + "1" + strings.Repeat("}", n) + "\n", 5},
		{"arrays across lines", valid + "x = [\n" + strings.Repeat("[\n", n) + strings.Repeat("]\n", n) + "]\n", 2 + MaxDepth}, // under [services.s], x is at level 3
		{"table header", valid + "[" + dotted + "]\n", 4},
		{"array of tables header", valid + "[[" + dotted + "]]\n", 4},
		{"quoted header parts", valid + "[" + strings.Repeat(`"a.b".'c'.`, n) + "x]\n", 4},
		{"dotted key", valid + dotted + " = 1\n", 4},
		{"dotted key in an inline table", valid + "x = {" + dotted + " = 1}\n", 4},
		{"header plus dotted key", valid + "[" + strings.Repeat("a.", 20) + "a]\n" + strings.Repeat("b.", 20) + "b = 1\n", 5},
		{"array of inline tables of arrays", valid + "x = " + strings.Repeat("[{a=", n) + "1" + strings.Repeat("}]", n) + "\n", 4},
		{"after a multi-line string", valid + "s = \"\"\"\n[\n[\n\"\"\"\nx = " + strings.Repeat("[", n) + strings.Repeat("]", n) + "\n", 8},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse("f.toml", []byte(tt.src))
			var ce *Error
			if !errors.As(err, &ce) || !strings.Contains(err.Error(), fmt.Sprintf("nested deeper than %d levels", MaxDepth)) {
				t.Fatalf("Parse = %v; want it refused as nested deeper than %d levels", err, MaxDepth)
			}
			if want := fmt.Sprintf("f.toml:%d: ", tt.line); !strings.HasPrefix(err.Error(), want) {
				t.Errorf("Parse = %q; want it located at %q", err, want)
			}
		})
	}
}

// TestDepthAllowed: nesting up to MaxDepth, and brackets that are not
// nesting (in strings of every kind and in comments), pass the scan.
func TestDepthAllowed(t *testing.T) {
	deep := strings.Repeat("[", 1000) + strings.Repeat("]", 1000)
	tests := []struct{ name, src string }{
		{"the limit in arrays", "x = " + strings.Repeat("[", MaxDepth) + strings.Repeat("]", MaxDepth) + "\n"},
		{"the limit in inline tables", "x = " + strings.Repeat("{a=", MaxDepth-1) + "{}" + strings.Repeat("}", MaxDepth-1) + "\n"},
		{"the limit in a header", "[" + strings.Repeat("a.", MaxDepth-1) + "a]\n"},
		{"the limit, header and key", "[[" + strings.Repeat("a.", MaxDepth/2-2) + "a]]\n" + strings.Repeat("b.", MaxDepth/2-1) + "b = 1\n"},
		{"basic string", "x = \"" + deep + "\"\n"},
		{"escaped quotes", `x = "\"` + deep + `\\"` + "\ny = 1\n"},
		{"literal string", "x = '" + deep + "'\n"},
		{"multi-line basic", "x = \"\"\"\n" + deep + "\n\\\"\"\"" + deep + "\"\"\"\"\"\n"},
		{"multi-line literal", "x = '''\n" + deep + "\n'''\n"},
		{"comment", "# " + deep + "\nx = [1, # " + deep + "\n 2]\n"},
		{"quoted key", `"` + deep + `" = 1` + "\n['" + deep + "']\n"},
		{"many shallow", strings.Repeat("[a]\nb = [[1], [2], {c = [3]}]\n", 1000)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := checkDepth("f.toml", []byte(tt.src)); err != nil {
				t.Errorf("checkDepth = %v; want nil", err)
			}
		})
	}
}

// TestDepthFast: the scan is linear: 4 MiB of the worst kinds for it
// (strings, comments and brackets, one line after another) is scanned in
// about 50 ms, where a quadratic scan would take hours; and the deepest
// bomb, 16 MiB (MaxSize) of "[", is refused at once, never reaching the
// decoder, whose stack it would overflow.
func TestDepthFast(t *testing.T) {
	bomb := []byte("x = " + strings.Repeat("[", MaxSize-8) + "\n")
	start := time.Now()
	if _, err := Parse("f.toml", bomb); err == nil || !strings.Contains(err.Error(), "nested deeper") {
		t.Fatalf("Parse(16 MiB of [) = %v; want refused for its depth", err)
	}
	if d := time.Since(start); d > 30*time.Second { // microseconds; room for -race on a busy machine
		t.Errorf("refusing 16 MiB of [ took %v", d)
	}
	line := "x = \"[[[[{{{{\" # [[[[ {{{{\ny = [[1, 2], ['[', \"{\"], {a = 1}]\n"
	wide := []byte(strings.Repeat(line, (4<<20)/len(line)))
	start = time.Now()
	if err := checkDepth("f.toml", wide); err != nil {
		t.Fatalf("checkDepth(wide) = %v; want nil", err)
	}
	if d := time.Since(start); d > 60*time.Second { // about 50 ms, 1 s under -race; far from hours
		t.Errorf("scanning 4 MiB took %v; want it linear", d)
	}
}

// TestDepthSamples: every example file shipped passes the scan.
func TestDepthSamples(t *testing.T) {
	for _, p := range []string{"../systemd/fulcrum.toml", "../demo.toml"} {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		if err := checkDepth(p, b); err != nil {
			t.Errorf("checkDepth(%s) = %v", p, err)
		}
	}
	if err := checkDepth("sample", []byte(sample)); err != nil {
		t.Errorf("checkDepth(sample) = %v", err)
	}
}
