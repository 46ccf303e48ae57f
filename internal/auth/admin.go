package auth

import (
	"crypto/subtle"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync/atomic"
)

// MinAdminToken is the shortest admin token accepted, in bytes.
const MinAdminToken = 16

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
// be empty); at least one token is required.
func NewAdmins(fixed, file string) (*Admins, error) {
	a := &Admins{fixed: fixed, file: file}
	if err := a.Reload(); err != nil {
		return nil, err
	}
	return a, nil
}

// Reload reads the file again; on error the tokens in use stay.
func (a *Admins) Reload() error {
	var tokens [][]byte
	if a.fixed != "" {
		tokens = append(tokens, []byte(a.fixed))
	}
	if a.file != "" {
		b, err := os.ReadFile(a.file)
		if err != nil {
			return fmt.Errorf("admin token file: %w", err)
		}
		for n, line := range strings.Split(string(b), "\n") {
			line = strings.TrimSpace(line)
			if line == "" || strings.HasPrefix(line, "#") {
				continue
			}
			if len(line) < MinAdminToken {
				return fmt.Errorf("admin token file %s line %d: a token of %d bytes; want at least %d", a.file, n+1, len(line), MinAdminToken)
			}
			tokens = append(tokens, []byte(line))
		}
	}
	if len(tokens) == 0 {
		return errors.New("no admin token: give --admin-token or --admin-token-file")
	}
	a.tokens.Store(&tokens)
	return nil
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
