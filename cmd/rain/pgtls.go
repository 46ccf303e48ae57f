package main

// This file checks how a --postgres connection reaches its server: grants
// and accounts cross that link, and its password too.

import (
	"net"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
)

// PostgreSQL links, as pgTLS tells them apart.
const (
	pgPlain    = "disable"        // no TLS
	pgFallback = "prefer"         // TLS if the server offers it, else plain text, silently (or allow: the other way round)
	pgNoVerify = "require"        // TLS, the server's certificate not checked
	pgVerified = "verify-ca/full" // TLS, the certificate checked
)

// pgTLS says which link cfg makes, from the TLS configuration pgx built
// for it out of sslmode (in the URL, PGSSLMODE, or its default, prefer):
// pgx makes prefer as TLS with a plain-text fallback, allow as plain text
// with a TLS fallback, and require as TLS with no check of the
// certificate (unless a root certificate is given: then it checks the
// chain, as verify-ca).
func pgTLS(cfg *pgconn.Config) string {
	plainFallback, tlsFallback := false, false
	for _, fb := range cfg.Fallbacks {
		if fb.TLSConfig == nil {
			plainFallback = true
		} else {
			tlsFallback = true
		}
	}
	switch {
	case cfg.TLSConfig == nil && !tlsFallback:
		return pgPlain
	case cfg.TLSConfig == nil || plainFallback:
		return pgFallback
	case cfg.TLSConfig.InsecureSkipVerify && cfg.TLSConfig.VerifyPeerCertificate == nil:
		return pgNoVerify
	}
	return pgVerified
}

// checkPostgresTLS refuses a --postgres (url) whose link falls back to
// plain text without a word (sslmode prefer, pgx's default, or allow), and
// has warn say so of one in plain text to another host (disable) or to a
// server whose certificate is not checked (require). A url pgx cannot
// parse is left to the open that follows, which says why.
func checkPostgresTLS(url string, warn func(string)) error {
	cfg, err := pgconn.ParseConfig(url)
	if err != nil {
		return nil
	}
	switch pgTLS(cfg) {
	case pgFallback:
		return usagef("--postgres: sslmode prefer (the default) or allow falls back to plain text without a word, and checks no certificate: give sslmode=verify-full (and sslrootcert), or sslmode=disable on purpose for a database on this host or a private network")
	case pgNoVerify:
		warn("--postgres: sslmode=require encrypts, but checks no certificate: anyone on the path can pose as the database; give sslmode=verify-full (and sslrootcert)")
	case pgPlain:
		if !loopbackHost(cfg.Host) {
			warn("--postgres: sslmode=disable: grants, accounts and the password cross the network in plain text; give sslmode=verify-full (and sslrootcert) unless the network is yours alone")
		}
	}
	return nil
}

// loopbackHost says whether a PostgreSQL host is this machine: a Unix
// socket's directory, localhost, or a loopback address.
func loopbackHost(host string) bool {
	if strings.HasPrefix(host, "/") || host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
