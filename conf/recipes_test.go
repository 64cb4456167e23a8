package conf

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"fulcrum/internal/testkit"
)

// TestDatabaseRecipes: every TOML block of docs/databases.md is a valid
// configuration, with its password files (under /etc/fulcrum, or in
// systemd's $CREDENTIALS_DIRECTORY) and TLS files (under /etc/fulcrum) made
// up in a temporary directory.
func TestDatabaseRecipes(t *testing.T) {
	doc, err := os.ReadFile("../docs/databases.md")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	for _, f := range []string{"pg.pw", "mysql.pw", "redis.pw"} {
		if err := os.WriteFile(filepath.Join(dir, f), []byte("secret\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	t.Setenv("CREDENTIALS_DIRECTORY", dir) // as systemd sets it with LoadCredential=
	ca := testkit.NewCA(t)                 // the TLS recipes' files
	testkit.WritePair(t, dir, ca.IssueClient(t, "fulcrum"))
	for from, to := range map[string]string{"server.crt": "client.crt", "server.key": "client.key"} {
		if err := os.Rename(filepath.Join(dir, from), filepath.Join(dir, to)); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "ca.pem"), ca.CertPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	blocks := regexp.MustCompile("(?s)```toml\n(.*?)```").FindAllSubmatch(doc, -1)
	if len(blocks) < 4 {
		t.Fatalf("%d TOML blocks in docs/databases.md; want the four recipes", len(blocks))
	}
	for i, b := range blocks {
		src := strings.ReplaceAll(string(b[1]), "/etc/fulcrum/", dir+"/")
		if _, err := Parse("databases.md", []byte(src)); err != nil {
			t.Errorf("block %d:\n%s\n%v", i+1, b[1], err)
		}
	}
}
