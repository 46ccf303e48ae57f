package auth

// This file is the client a jwks-url is fetched with: the login service's
// key set decides who every grab is, so the fetch goes over https only
// (redirects included) and reads a bounded answer.

import (
	"fmt"
	"io"
	"net/http"
)

// maxJWKS bounds the answer of a jwks-url: a login service's key set is a
// few kilobytes; an endpoint that sends more does not fill rain's memory.
// maxJWKSRedirects bounds the redirects a fetch follows.
const (
	maxJWKS          = 256 << 10
	maxJWKSRedirects = 3
)

// jwksClient is base (or a client with the fetch timeout) with its
// redirects refused unless to https (http too with allowHTTP), at most
// maxJWKSRedirects of them, and its answers cut at maxJWKS bytes.
func jwksClient(base *http.Client, allowHTTP bool) *http.Client {
	c := http.Client{Timeout: jwksFetchTimeout}
	if base != nil {
		c = *base
	}
	c.CheckRedirect = func(req *http.Request, via []*http.Request) error {
		if req.URL.Scheme != "https" && !allowHTTP {
			return fmt.Errorf("user auth: the key set redirects to %s, which is not https", req.URL.Redacted())
		}
		if len(via) > maxJWKSRedirects {
			return fmt.Errorf("user auth: the key set redirects more than %d times", maxJWKSRedirects)
		}
		return nil
	}
	rt := c.Transport
	if rt == nil {
		rt = http.DefaultTransport
	}
	c.Transport = cappedTransport{rt}
	return &c
}

// cappedTransport cuts every answer at maxJWKS bytes: reading more fails.
type cappedTransport struct{ rt http.RoundTripper }

func (t cappedTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := t.rt.RoundTrip(req)
	if err == nil {
		resp.Body = &cappedBody{ReadCloser: resp.Body, left: maxJWKS}
	}
	return resp, err
}

// errJWKSTooLarge fails the read of an answer over maxJWKS bytes.
var errJWKSTooLarge = fmt.Errorf("user auth: the key set is larger than %d bytes", maxJWKS)

// cappedBody reads at most left bytes of its body, then fails.
type cappedBody struct {
	io.ReadCloser
	left int64
}

func (b *cappedBody) Read(p []byte) (int, error) {
	if b.left <= 0 {
		return 0, errJWKSTooLarge
	}
	if int64(len(p)) > b.left {
		p = p[:b.left]
	}
	n, err := b.ReadCloser.Read(p)
	b.left -= int64(n)
	return n, err
}
