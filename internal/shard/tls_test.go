package shard

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"rain/internal/redistest"
)

// TestTLSAndAuth: a shard given as rediss://user:password@host:port is
// reached over TLS (the server's certificate checked against the CA given)
// with AUTH as that user; a wrong password, an untrusted certificate and
// plain TCP to the TLS port all fail; the password never shows in the
// spec's String or in a parse error.
func TestTLSAndAuth(t *testing.T) {
	tl := redistest.NewTLS(t)
	redistest.Start(t, redistest.Options{Args: append(tl.Args,
		"--requirepass", "default-pw",
		"--user", "rain", "on", ">rain-pw", "~*", "&*", "+@all")})
	pemCA, err := os.ReadFile(tl.CAFile)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(pemCA)
	trusted := Options{TLS: &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}}
	open := func(addr string, opts Options) error { return useShard(t, addr, opts, "rain-pw") }
	good := fmt.Sprintf("rediss://rain:rain-pw@127.0.0.1:%d", tl.Port)
	if err := open(good, trusted); err != nil {
		t.Fatalf("TLS + AUTH: %v", err)
	}
	for _, c := range []struct {
		what, addr string
		opts       Options
	}{
		{"a wrong password", fmt.Sprintf("rediss://rain:nope@127.0.0.1:%d", tl.Port), trusted},
		{"no password", fmt.Sprintf("rediss://127.0.0.1:%d", tl.Port), trusted},
		{"an untrusted certificate", good, Options{}},
		{"plain TCP to the TLS port", fmt.Sprintf("redis://rain:rain-pw@127.0.0.1:%d", tl.Port), trusted},
	} {
		if err := open(c.addr, c.opts); err == nil {
			t.Errorf("%s: connected, want refused", c.what)
		}
	}
	specs, _ := ParseSpecs("t=1@" + good)
	if s := specs[0].String(); strings.Contains(s, "rain-pw") {
		t.Errorf("String() = %q shows the password", s)
	}
	if _, err := ParseSpecs("t=1@rediss://rain:rain-pw@127.0.0.1:99999"); err == nil || strings.Contains(err.Error(), "rain-pw") {
		t.Errorf("bad port: %v; want an error without the password", err)
	}
}

// TestSentinelAuth: a shard behind Sentinel whose primary requires a
// password (the sentinel holds it as auth-pass) is reached with the
// password of sentinel/[USER:]PASSWORD@MASTER/...; a wrong password or none
// fails; the password never shows in the spec's String.
func TestSentinelAuth(t *testing.T) {
	const pw = "s/ntinel-pw" // a '/', percent-encoded in the spec
	primary := redistest.Start(t, redistest.Options{Args: []string{"--requirepass", pw, "--masterauth", pw}})
	sentinel := redistest.StartSentinelAuth(t, "authm", primary.Addr, 1, 5*time.Second, pw)
	open := func(addr string) error { return useShard(t, addr, Options{}, "ntinel-pw") }
	if err := open("sentinel/:s%2Fntinel-pw@authm/" + sentinel.Addr); err != nil {
		t.Fatalf("through the sentinel with the password: %v", err)
	}
	if err := open("sentinel/default:s%2Fntinel-pw@authm/" + sentinel.Addr); err != nil {
		t.Fatalf("as user default with the password: %v", err)
	}
	for what, addr := range map[string]string{
		"a wrong password": "sentinel/:nope@authm/" + sentinel.Addr,
		"no password":      "sentinel/authm/" + sentinel.Addr,
	} {
		if err := open(addr); err == nil {
			t.Errorf("%s: connected, want refused", what)
		}
	}
}

// TestSentinelTLS: a shard given as sentinel+tls/MASTER/... is reached
// over TLS, at the sentinels and at the primary they name, each
// certificate checked against the CA given: the sentinel's TLS port through
// plain sentinel/ fails, so does an untrusted certificate.
func TestSentinelTLS(t *testing.T) {
	tl := redistest.NewTLS(t)
	redistest.Start(t, redistest.Options{Args: tl.Args})
	st := tl.OnAnotherPort(t)
	redistest.StartSentinelTLS(t, "tlsm", fmt.Sprintf("127.0.0.1:%d", tl.Port), st)
	pemCA, err := os.ReadFile(tl.CAFile)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(pemCA)
	trusted := Options{TLS: &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}}
	addr := fmt.Sprintf("sentinel+tls/tlsm/127.0.0.1:%d", st.Port)
	if err := useShard(t, addr, trusted, "none"); err != nil {
		t.Fatalf("through the sentinel over TLS: %v", err)
	}
	if err := useShard(t, addr, Options{}, "none"); err == nil {
		t.Error("an untrusted certificate: connected, want refused")
	}
	if err := useShard(t, fmt.Sprintf("sentinel/tlsm/127.0.0.1:%d", st.Port), trusted, "none"); err == nil {
		t.Error("plain sentinel/ to the sentinel's TLS port: connected, want refused")
	}
}

// useShard opens the shard of addr (one spec, "t=1@addr"), writes a key
// and runs a script on it; the spec's String must not show secret.
func useShard(t *testing.T, addr string, opts Options, secret string) error {
	t.Helper()
	specs, err := ParseSpecs("t=1@" + addr)
	if err != nil {
		return err
	}
	if s := specs[0].String(); strings.Contains(s, secret) {
		t.Errorf("String() = %q shows the password", s)
	}
	set, err := Open(specs, 0, opts)
	if err != nil {
		return err
	}
	defer set.Close()
	ctx := context.Background()
	c := set.Client("t")
	if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
		return err
	}
	return c.Eval(ctx, "return redis.call('GET', KEYS[1])", []string{"k"}).Err()
}
