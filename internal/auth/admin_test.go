package auth

import (
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestCheckAdminToken: what openssl rand makes of 16 bytes or more is
// taken, in every spelling (hex in either case, base64 standard or
// URL-safe, padded or not); a token a person makes up is refused, with the
// advice.
func TestCheckAdminToken(t *testing.T) {
	for range 20_000 {
		b := make([]byte, 16+len(t.Name())%8)
		_, _ = rand.Read(b)
		for _, tok := range []string{hex.EncodeToString(b), strings.ToUpper(hex.EncodeToString(b)),
			base64.StdEncoding.EncodeToString(b), base64.RawURLEncoding.EncodeToString(b)} {
			if err := CheckAdminToken(tok); err != nil {
				t.Fatalf("CheckAdminToken(%q), random: %v", tok, err)
			}
		}
	}
	for _, tok := range []string{
		"", "aaaaaaaaaaaaaaaa", strings.Repeat("a", 64), "admin-token-aaaaaaaa", "sekret-sekret-sekret",
		"0123456789abcdef0123456789abcdef", "deadbeefdeadbeefdeadbeefdeadbeef", "abcdefghijklmnopqrstuvwxyz012345",
		"0f1e2d3c4b5a6978", // hex of 8 bytes
		"correct horse battery staple", "passw0rd!passw0rd!passw0rd!", "Tr0ub4dor&3Tr0ub4dor&3Tr0ub4dor",
		strings.Repeat("ab", 16) + "c", "13579bdf13579bdf13579bdf1357",
	} {
		err := CheckAdminToken(tok)
		if err == nil || !strings.Contains(err.Error(), "openssl rand -hex 16") {
			t.Errorf("CheckAdminToken(%q) = %v, want refused with the advice", tok, err)
		}
	}
}

// FuzzCheckAdminToken: any input is answered without a panic, and what is
// taken is at least 22 characters of hex or base64 that repeat no block.
func FuzzCheckAdminToken(f *testing.F) {
	for _, s := range []string{"", "aaaa", "6f1c2a9e4b7d03158ce2f4a96b0d7e31", "bK3x9Qm2PzL7vN4tR8sW1g==", "bK3x9Qm2PzL7vN4tR8sW1g===", "ab\x00cd"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, tok string) {
		if CheckAdminToken(tok) != nil {
			return
		}
		body := strings.TrimRight(tok, "=")
		if len(body) < minBase64Token || !onlyOf(body, base64Chars) || period(body) != 0 || len(tok)-len(body) > 2 {
			t.Fatalf("CheckAdminToken(%q) took a token that is not 22 or more characters of base64 without a repeated block", tok)
		}
	})
}

func writeTokens(t *testing.T, path, content string, mode os.FileMode) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, mode); err != nil { // whatever the umask
		t.Fatal(err)
	}
}

// TestAdminsRevocationFailsClosed: a reload takes the file's tokens as it
// lists them now, even when it reports an error: a token taken out of the
// file at the same time as a bad line is put in is revoked (the bad line
// is not taken, the good lines are); a file that cannot be read, or that
// any user may write, leaves none of its tokens in use (the fixed one
// stays); a file fixed again brings them back.
func TestAdminsRevocationFailsClosed(t *testing.T) {
	path := filepath.Join(t.TempDir(), "admins")
	fixed, a, b, c := "fixed-not-checked", "9c2e71f04ab83d56e1f7a0c4b9d23e68", "e7b19c04d2a35f86e7b19c04d2a35f87", "4f9d2c7a1e8b3065f9d2c7a1e8b30654"
	writeTokens(t, path, "# operators\n"+a+"\n"+b+"\n", 0o600)
	admins, err := NewAdmins(fixed, path)
	if err != nil {
		t.Fatal(err)
	}
	want := func(step string, valid map[string]bool) {
		t.Helper()
		for tok, ok := range valid {
			if admins.Valid(tok) != ok {
				t.Errorf("%s: Valid(%s) = %v, want %v", step, tok, !ok, ok)
			}
		}
	}
	want("loaded", map[string]bool{fixed: true, a: true, b: true, c: false, "": false})

	writeTokens(t, path, b+"\nshort\n"+c+"\n", 0o600) // a revoked, a bad line added
	if err := admins.Reload(); err == nil || !strings.Contains(err.Error(), "line 2") {
		t.Fatalf("reload of a file with a bad line = %v, want an error naming line 2", err)
	}
	want("a bad line beside a revocation", map[string]bool{fixed: true, a: false, b: true, c: true, "short": false})

	writeTokens(t, path, b+"\n", 0o646)
	if err := admins.Reload(); err == nil || !strings.Contains(err.Error(), "chmod o-w") {
		t.Fatalf("reload of a world-writable file = %v, want refused", err)
	}
	want("a world-writable file", map[string]bool{fixed: true, b: false, c: false})
	if _, err := NewAdmins("", path); err == nil {
		t.Fatal("NewAdmins of a world-writable file succeeded")
	}

	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if err := admins.Reload(); err == nil {
		t.Fatal("reload of a missing file succeeded")
	}
	want("a missing file", map[string]bool{fixed: true, b: false})

	writeTokens(t, path, c+"\n", 0o640)
	if err := admins.Reload(); err != nil {
		t.Fatal(err)
	}
	want("the file fixed", map[string]bool{fixed: true, b: false, c: true})
}

// FuzzAdminTokenFile: a token file of any bytes is read without a panic;
// the tokens in use are exactly its lines (trimmed, blank lines and #
// comments skipped) that CheckAdminToken accepts, and a line it refuses
// makes an error and is not in use.
func FuzzAdminTokenFile(f *testing.F) {
	for _, s := range []string{
		"",
		"6f1c2a9e4b7d03158ce2f4a96b0d7e31\n",
		"# old\n6f1c2a9e4b7d03158ce2f4a96b0d7e31\r\n\n  bK3x9Qm2PzL7vN4tR8sW1g==  \nshort\n",
		"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\n\x00\xff",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, content []byte) {
		path := filepath.Join(t.TempDir(), "tokens")
		writeTokens(t, path, string(content), 0o600)
		a := &Admins{file: path}
		err := a.Reload() // as NewAdmins, which also refuses the file when err != nil
		var good, bad []string
		for line := range strings.SplitSeq(string(content), "\n") {
			line = strings.TrimSpace(line)
			switch {
			case line == "" || strings.HasPrefix(line, "#"):
			case CheckAdminToken(line) == nil:
				good = append(good, line)
			default:
				bad = append(bad, line)
			}
		}
		if len(good) == 0 {
			if err == nil {
				t.Fatalf("Reload of %q took no token and reported nothing", content)
			}
			return
		}
		if (len(bad) > 0) != (err != nil) {
			t.Fatalf("Reload of %q: %d bad lines, error %v", content, len(bad), err)
		}
		for _, tok := range good {
			if !a.Valid(tok) {
				t.Fatalf("token %q of the file %q is not in use", tok, content)
			}
		}
		for _, tok := range bad {
			if a.Valid(tok) {
				t.Fatalf("line %q of the file %q, not an acceptable token, is in use", tok, content)
			}
		}
	})
}
