package e2e

import (
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// TestDesignImports holds the package graph in docs/design.md to the
// imports: every package of fulcrum's (but the test kits, the e2e and
// torture tests and the bench tools) has a line there, and the line names exactly the packages of
// fulcrum's it imports.
func TestDesignImports(t *testing.T) {
	doc, err := os.ReadFile("../../docs/design.md")
	if err != nil {
		t.Fatal(err)
	}
	drawn := map[string][]string{}
	in := false
	for _, l := range strings.Split(string(doc), "\n") {
		switch {
		case l == "```" && !in && len(drawn) == 0:
			in = true
		case l == "```" && in:
			in = false
		case in:
			pkg, rest, ok := strings.Cut(l, "─▶")
			if !ok {
				t.Fatalf("docs/design.md: %q is not \"package ─▶ imports   what it owns\"", l)
			}
			list, _, _ := strings.Cut(strings.TrimSpace(rest), "   ")
			var imps []string
			if list != "(none)" {
				for _, p := range strings.Split(list, ",") {
					imps = append(imps, strings.TrimSpace(p))
				}
			}
			drawn[strings.TrimSpace(pkg)] = imps
		}
	}
	if len(drawn) == 0 {
		t.Fatal("docs/design.md has no package graph")
	}
	list := exec.Command(goTool(), "list", "-f", `{{.ImportPath}} {{join .Imports " "}}`, "./...")
	list.Dir = "../.." // the module root
	out, err := list.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	skip := func(p string) bool {
		return strings.HasPrefix(p, "bench/") || strings.HasSuffix(p, "test") ||
			strings.HasPrefix(p, "internal/testkit") || p == "internal/e2e" || p == "internal/torture"
	}
	for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(l)
		pkg := strings.TrimPrefix(strings.TrimPrefix(f[0], "fulcrum"), "/")
		if pkg == "" {
			pkg = "main"
		}
		if skip(pkg) {
			continue
		}
		var imps []string
		for _, imp := range f[1:] {
			if rest, ok := strings.CutPrefix(imp, "fulcrum/"); ok && !skip(rest) {
				imps = append(imps, rest)
			}
		}
		slices.Sort(imps)
		want, ok := drawn[pkg]
		if !ok {
			t.Errorf("docs/design.md draws no line for package %s (imports %v)", pkg, imps)
			continue
		}
		delete(drawn, pkg)
		got := slices.Sorted(slices.Values(want))
		if !slices.Equal(got, imps) {
			t.Errorf("docs/design.md: %s ─▶ %v; it imports %v", pkg, got, imps)
		}
	}
	for pkg := range drawn {
		t.Errorf("docs/design.md draws package %s, which does not exist", pkg)
	}
}
