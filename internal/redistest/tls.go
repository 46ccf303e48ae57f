package redistest

// This file makes the certificates of a server reached over TLS.

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

// TLS is what a test needs to reach a server over TLS: the arguments that
// give redis-server a TLS port with a certificate for 127.0.0.1 signed by a
// CA made for the test (clients are not asked for certificates), the CA's
// PEM file and the TLS port.
type TLS struct {
	Args   []string
	CAFile string
	Port   int

	certFile, keyFile string
}

// OnAnotherPort is the same CA and certificate on another free port (for a
// second server of a test, a sentinel say).
func (tl TLS) OnAnotherPort(tb testing.TB) TLS {
	tb.Helper()
	port, err := freePort()
	if err != nil {
		tb.Fatal(err)
	}
	return tl.on(port)
}

// on is tl on port.
func (tl TLS) on(port int) TLS {
	tl.Port = port
	tl.Args = []string{"--tls-port", strconv.Itoa(port), "--tls-cert-file", tl.certFile, "--tls-key-file", tl.keyFile,
		"--tls-ca-cert-file", tl.CAFile, "--tls-auth-clients", "no"}
	return tl
}

// NewTLS makes a CA and a server certificate for 127.0.0.1 in a temporary
// directory, and picks a free port for TLS.
func NewTLS(tb testing.TB) TLS {
	tb.Helper()
	dir := tb.TempDir()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		tb.Fatal(err)
	}
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "rain test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		tb.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		tb.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "127.0.0.1"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		tb.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		tb.Fatal(err)
	}
	write := func(name, typ string, b []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: b}), 0o600); err != nil {
			tb.Fatal(err)
		}
		return p
	}
	caFile := write("ca.pem", "CERTIFICATE", caDER)
	certFile := write("server.pem", "CERTIFICATE", der)
	keyFile := write("server.key", "EC PRIVATE KEY", keyDER)
	port, err := freePort()
	if err != nil {
		tb.Fatal(err)
	}
	return TLS{CAFile: caFile, certFile: certFile, keyFile: keyFile}.on(port)
}
