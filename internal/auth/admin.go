package auth

import (
	"crypto/subtle"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync/atomic"
)

// Admins holds the admin tokens: one given as such (--admin-token) and
// those of a file (--admin-token-file: one a line, blank lines and lines
// starting with # skipped), so that a new token can be added, rolled out,
// and the old one removed, each step a reload. Safe for concurrent use.
type Admins struct {
	fixed  string
	file   string
	tokens atomic.Pointer[[][]byte]
}

// NewAdmins returns the admin tokens of fixed (may be empty) and file (may
// be empty); at least one token is required, and every line of the file
// must be a token CheckAdminToken accepts. fixed is taken as given: the
// caller checks it (rain serve does on real shards).
func NewAdmins(fixed, file string) (*Admins, error) {
	a := &Admins{fixed: fixed, file: file}
	if err := a.Reload(); err != nil {
		return nil, err
	}
	return a, nil
}

// Reload reads the file again, and the tokens it lists replace the file's
// tokens in use whatever else it holds: a line that is no acceptable token
// is left out (and named in the error), and a file that cannot be read (or
// that users other than its owner may write) leaves none of its tokens in
// use. So a token taken out of the file is revoked by the reload even when
// the reload reports an error: a revocation never fails open. The fixed
// token stays.
func (a *Admins) Reload() error {
	var tokens [][]byte
	if a.fixed != "" {
		tokens = append(tokens, []byte(a.fixed))
	}
	fileTokens, err := a.readFile()
	tokens = append(tokens, fileTokens...)
	a.tokens.Store(&tokens)
	if err != nil {
		return err
	}
	if len(tokens) == 0 {
		return errors.New("no admin token: give --admin-token or --admin-token-file")
	}
	return nil
}

// readFile returns the acceptable tokens of the file, and an error naming
// each line that is not one (or saying why the file cannot be read).
func (a *Admins) readFile() ([][]byte, error) {
	if a.file == "" {
		return nil, nil
	}
	b, err := ReadKeyFile(a.file)
	if err != nil {
		return nil, fmt.Errorf("admin token file: %w (none of its tokens is in use)", err)
	}
	var tokens [][]byte
	var errs []error
	for n, line := range strings.Split(string(b), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if err := CheckAdminToken(line); err != nil {
			errs = append(errs, fmt.Errorf("admin token file %s line %d: %w (not in use)", a.file, n+1, err))
			continue
		}
		tokens = append(tokens, []byte(line))
	}
	return tokens, errors.Join(errs...)
}

// Valid reports whether token is one of the admin tokens. It compares with
// every token in constant time (no early exit), so the time taken says
// nothing of which token came close.
func (a *Admins) Valid(token string) bool {
	ok := 0
	for _, t := range *a.tokens.Load() {
		ok |= subtle.ConstantTimeCompare([]byte(token), t)
	}
	return ok == 1 && token != ""
}

// ReadKeyFile reads a file of keys or secrets (admin tokens, a signing
// key, a CA). It refuses a file that every user of the host may write:
// anyone could put a key of their own in it.
func ReadKeyFile(path string) ([]byte, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if m := fi.Mode().Perm(); m&0o002 != 0 {
		return nil, fmt.Errorf("%s: any user may write it (mode %#o): chmod o-w %s", path, m, path)
	}
	return os.ReadFile(path)
}

// WorldReadable reports whether every user of the host may read the file
// at path (its mode has o+r). A secret in it is theirs too.
func WorldReadable(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.Mode().Perm()&0o004 != 0
}
