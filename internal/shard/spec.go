package shard

// This file owns the shard spec: its text form "name=weight@host:port" (or
// "name=weight@sentinel/MASTER/host:port+host:port+..." for a shard whose
// primary Redis Sentinel elects, "sentinel+tls/..." for the same over TLS,
// "name=weight@cluster/host:port+host:port+..." for a Redis Cluster given
// by seed nodes, "cluster+tls/..." over TLS, or
// "name=weight@redis://user:password@host:port" for AUTH and
// "rediss://..." for TLS), the rules a spec must meet, and the parser for
// the comma-separated list the operator gives on the command line.

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"
)

// Limits on the parts of a spec.
const (
	MaxNameLen = 64   // names are 1–MaxNameLen bytes of [A-Za-z0-9_.-]
	MaxWeight  = 1000 // weights are integers 1–MaxWeight
)

// Spec names one shard: the ring places keys by Name and Weight; Addr is only
// where the shard's Redis listens, so moving a shard to a new address moves no
// keys.
//
// A shard run highly available names its Sentinel instead of an address:
// Addr is "sentinel/MASTER/host:port+host:port+...", the master name the
// sentinels watch and their addresses; the client asks them for the primary
// and follows a failover by itself.
type Spec struct {
	Name   string // 1–MaxNameLen bytes of [A-Za-z0-9_.-], unique within a ring
	Weight int    // 1–MaxWeight; a shard's share of keys is Weight / Σ Weight
	Addr   string // host:port, or the sentinel form; kept as written
}

// sentinelPrefix starts the Addr of a shard behind Redis Sentinel;
// sentinelTLSPrefix one whose sentinels, primary and replicas are reached
// over TLS.
const (
	sentinelPrefix    = "sentinel/"
	sentinelTLSPrefix = "sentinel+tls/"
)

// SentinelShard is a shard reached through Redis Sentinel:
// sentinel/[USER:PASSWORD@]MASTER/host:port+host:port+..., or
// sentinel+tls/... over TLS.
type SentinelShard struct {
	Master    string   // the name the sentinels watch
	Sentinels []string // their host:ports
	// Username and Password, when given (percent-encoded in the spec),
	// are the AUTH of the primary and its replicas (masterauth, and
	// sentinel auth-pass on the sentinels' side). Empty: none.
	Username, Password string
	// TLS: the sentinels, the primary and its replicas are reached over
	// TLS (their certificates checked as a rediss:// shard's are), as the
	// sentinels reach them (tls-replication yes).
	TLS bool
}

// Sentinel returns the shard's sentinel form; ok is false for another
// address. Specs from ParseSpecs are checked: their forms parse.
func (s Spec) Sentinel() (SentinelShard, bool) {
	sh, ok, _ := parseSentinel(s.Addr)
	return sh, ok
}

// parseSentinel parses the sentinel form of addr; ok is false when addr is
// not of it. Everything before the last '@' is the credentials (no
// sentinel address holds one), so a password cannot run into the rest.
func parseSentinel(addr string) (sh SentinelShard, ok bool, err error) {
	rest, tls, ok := cutForm(addr, sentinelPrefix, sentinelTLSPrefix)
	if !ok {
		return sh, false, nil
	}
	sh.TLS = tls
	if sh.Username, sh.Password, rest, err = cutCredentials(rest); err != nil {
		return sh, true, err
	}
	master, list, found := strings.Cut(rest, "/")
	if !found || master == "" || list == "" {
		return sh, true, errors.New("want sentinel/[USER:PASSWORD@]MASTER/ (or sentinel+tls/...) and the sentinels' host:port joined by +")
	}
	sh.Master, sh.Sentinels = master, strings.Split(list, "+")
	return sh, true, nil
}

// cutForm cuts the prefix of a shard form from addr: plain, or tlsPrefix
// (tls true); ok is false when addr starts with neither.
func cutForm(addr, plain, tlsPrefix string) (rest string, tls, ok bool) {
	if rest, ok = strings.CutPrefix(addr, plain); ok {
		return rest, false, true
	}
	rest, ok = strings.CutPrefix(addr, tlsPrefix)
	return rest, ok, ok
}

// cutCredentials cuts the percent-encoded USER:PASSWORD@ that may start
// rest, the part of a sentinel or cluster form after its prefix.
// Everything before the last '@' is the credentials (no host:port holds
// one), so a password cannot run into what follows.
func cutCredentials(rest string) (user, password, after string, err error) {
	at := strings.LastIndexByte(rest, '@')
	if at < 0 {
		return "", "", rest, nil
	}
	cred := rest[:at]
	if strings.Contains(cred, "/") {
		return "", "", rest, errors.New("the user or password has a '/': percent-encode it (%2F)")
	}
	u, p, _ := strings.Cut(cred, ":")
	if user, err = url.PathUnescape(u); err == nil {
		password, err = url.PathUnescape(p)
	}
	if err != nil {
		return "", "", rest, errors.New("bad percent-encoding in the user or password")
	}
	return user, password, rest[at+1:], nil
}

// clusterPrefix starts the Addr of a shard that is a whole Redis Cluster;
// clusterTLSPrefix one whose nodes are reached over TLS.
const (
	clusterPrefix    = "cluster/"
	clusterTLSPrefix = "cluster+tls/"
)

// ClusterShard is a shard that is a Redis Cluster:
// cluster/[USER:PASSWORD@]host:port+host:port+..., the seed nodes the
// client learns the cluster from, or cluster+tls/... over TLS. Its
// primaries count as shards when a pool's sub-pools are placed, and a
// sub-pool lives in the hash slot of its tag, wherever the cluster moves it.
type ClusterShard struct {
	Seeds []string // host:ports of some of its nodes
	// Username and Password, when given (percent-encoded in the spec),
	// are the AUTH of every node. Empty: none.
	Username, Password string
	// TLS: every node is reached over TLS (certificates checked as a
	// rediss:// shard's are).
	TLS bool
}

// Cluster returns the shard's cluster form; ok is false for another
// address. Specs from ParseSpecs are checked: their forms parse.
func (s Spec) Cluster() (ClusterShard, bool) {
	sh, ok, _ := parseCluster(s.Addr)
	return sh, ok
}

// parseCluster parses the cluster form of addr; ok is false when addr is
// not of it. Everything before the last '@' is the credentials (no node
// address holds one).
func parseCluster(addr string) (sh ClusterShard, ok bool, err error) {
	rest, tls, ok := cutForm(addr, clusterPrefix, clusterTLSPrefix)
	if !ok {
		return sh, false, nil
	}
	sh.TLS = tls
	if sh.Username, sh.Password, rest, err = cutCredentials(rest); err != nil {
		return sh, true, err
	}
	if rest == "" {
		return sh, true, errors.New("want cluster/[USER:PASSWORD@] (or cluster+tls/...) and seed nodes' host:port joined by +")
	}
	sh.Seeds = strings.Split(rest, "+")
	return sh, true, nil
}

// String formats s as "name=weight@host:port", the form ParseSpecs reads,
// with a password in a URL address masked (for logs and errors).
func (s Spec) String() string {
	return s.Name + "=" + strconv.Itoa(s.Weight) + "@" + redact(s.Addr)
}

// URL reports whether the shard's address is a URL: redis://[user:password@]host:port
// (AUTH) or rediss://... (TLS, and AUTH when given).
func (s Spec) URL() bool { return isURL(s.Addr) }

func isURL(addr string) bool {
	return hasPrefixFold(addr, "redis://") || hasPrefixFold(addr, "rediss://")
}

// ParseSpecs parses a comma-separated list of "name=weight@host:port" items,
// for example "s1=1@127.0.0.1:7001,s2=2@127.0.0.1:7002". Spaces around an item
// are ignored; an empty item (as from a trailing comma) is an error. Names must
// be unique. The specs are returned in the order written.
//
// Every error names the offending item and says what is wrong with it,
// never showing a password: an item is shown with its address's
// credentials masked, or by its place alone when it may be a piece of a
// password (no error reason quotes an address that may hold one).
func ParseSpecs(s string) ([]Spec, error) {
	if strings.TrimSpace(s) == "" {
		return nil, errors.New("shard specs: none given (want name=weight@host:port,...)")
	}
	items := strings.Split(s, ",")
	specs := make([]Spec, 0, len(items))
	seen := make(map[string]bool, len(items))
	for i, item := range items {
		item = strings.TrimSpace(item)
		if item == "" {
			return nil, fmt.Errorf("shard spec %d of %d: empty (stray comma?)", i+1, len(items))
		}
		sp, err := parseSpec(item)
		if err != nil {
			return nil, fmt.Errorf("shard spec %s: %w", describeItem(item, i, len(items)), err)
		}
		if seen[sp.Name] {
			return nil, fmt.Errorf("shard spec %s: duplicate name %q", describeItem(item, i, len(items)), sp.Name)
		}
		seen[sp.Name] = true
		specs = append(specs, sp)
	}
	return specs, nil
}

// parseSpec parses one trimmed item. Name and weight contain neither '=' nor
// '@', so splitting at the first of each is unambiguous; whatever follows the
// first '@' is the address.
func parseSpec(item string) (Spec, error) {
	name, rest, ok := strings.Cut(item, "=")
	if !ok {
		return Spec{}, errors.New(`missing "=" after the name (want name=weight@host:port)`)
	}
	weight, addr, ok := strings.Cut(rest, "@")
	if !ok {
		return Spec{}, errors.New(`missing "@" after the weight (want name=weight@host:port)`)
	}
	if markedAddr(name) >= 0 || markedAddr(weight) >= 0 {
		// Not quoted: it may hold a password.
		return Spec{}, errors.New("an address where the name or weight goes (want name=weight@host:port)")
	}
	if err := checkName(name); err != nil {
		return Spec{}, err
	}
	w, err := parseWeight(weight)
	if err != nil {
		return Spec{}, err
	}
	if err := checkShardAddr(addr); err != nil {
		return Spec{}, err
	}
	return Spec{Name: name, Weight: w, Addr: addr}, nil
}

// validate checks s against the rules ParseSpecs enforces, for specs built in
// code rather than parsed.
func (s Spec) validate() error {
	if err := checkName(s.Name); err != nil {
		return err
	}
	if s.Weight < 1 || s.Weight > MaxWeight {
		return fmt.Errorf("weight %d out of range 1-%d", s.Weight, MaxWeight)
	}
	return checkShardAddr(s.Addr)
}

func checkName(name string) error {
	if name == "" {
		return errors.New("empty name")
	}
	if len(name) > MaxNameLen {
		return fmt.Errorf("name is %d bytes, longer than %d", len(name), MaxNameLen)
	}
	for i := 0; i < len(name); i++ {
		if !isNameByte(name[i]) {
			return fmt.Errorf("name %q: byte %q not allowed (want A-Z a-z 0-9 _ . -)", name, name[i])
		}
	}
	return nil
}

func isNameByte(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' ||
		c == '_' || c == '.' || c == '-'
}

// parseWeight accepts only plain decimal digits without a leading zero, so
// every weight has one spelling and String round-trips exactly.
func parseWeight(s string) (int, error) {
	if s == "" {
		return 0, errors.New("empty weight")
	}
	if !allDigits(s) {
		return 0, fmt.Errorf("weight %q is not a decimal integer", s)
	}
	if len(s) > 1 && s[0] == '0' {
		return 0, fmt.Errorf("weight %q has a leading zero", s)
	}
	if len(s) > len(strconv.Itoa(MaxWeight)) {
		return 0, fmt.Errorf("weight %s out of range 1-%d", s, MaxWeight)
	}
	w, _ := strconv.Atoi(s) // cannot fail: at most 4 digits
	if w < 1 || w > MaxWeight {
		return 0, fmt.Errorf("weight %d out of range 1-%d", w, MaxWeight)
	}
	return w, nil
}

// checkShardAddr accepts a host:port, a redis:// or rediss:// URL, the
// sentinel form (a master name of name characters and one or more sentinel
// host:ports joined by '+'), or the cluster form (one or more seed
// host:ports joined by '+').
func checkShardAddr(addr string) error {
	if isURL(addr) {
		return checkURL(addr)
	}
	if cl, ok, err := parseCluster(addr); ok {
		if err != nil {
			return fmt.Errorf("cluster address %q: %w", redact(addr), err)
		}
		_, creds := userinfo("cluster://" + addr[credStart(addr):])
		for _, a := range cl.Seeds {
			if err := checkAddr(a); err != nil {
				if creds { // what follows the '@' may be a piece of the password
					return fmt.Errorf("cluster address %q: a seed host:port after the '@' is not valid", redact(addr))
				}
				return fmt.Errorf("cluster address %q: %w", redact(addr), err)
			}
		}
		return nil
	}
	sh, ok, err := parseSentinel(addr)
	if !ok {
		if strings.Contains(addr, "@") || markedAddr(addr) >= 0 {
			// Not quoted: what is before an '@' may be a password.
			return errors.New("an address with an '@' that is not redis://, rediss://, sentinel/, sentinel+tls/, cluster/ or cluster+tls/ (not shown: it may hold a password)")
		}
		return checkAddr(addr)
	}
	if err != nil {
		return fmt.Errorf("sentinel address %q: %w", redact(addr), err)
	}
	_, creds := userinfo("sentinel://" + addr[credStart(addr):])
	for i := 0; i < len(sh.Master); i++ {
		if !isNameByte(sh.Master[i]) {
			return fmt.Errorf("sentinel address %q: master name byte %q not allowed (want A-Z a-z 0-9 _ . -)", redact(addr), sh.Master[i])
		}
	}
	for _, a := range sh.Sentinels {
		if err := checkAddr(a); err != nil {
			if creds { // what follows the '@' may be a piece of the password
				return fmt.Errorf("sentinel address %q: a sentinel host:port after the '@' is not valid", redact(addr))
			}
			return fmt.Errorf("sentinel address %q: %w", redact(addr), err)
		}
	}
	return nil
}

// checkURL accepts redis://[user[:password]@]host:port[/0] and the same
// with rediss:// (TLS). Query parameters are not taken: rain sets the
// client's options itself.
//
// Errors show the address through redact, never the password; a URL that
// passes is one go-redis's ParseURL takes (NewClient relies on it).
func checkURL(addr string) error {
	if ui, ok := userinfo(addr); ok && strings.ContainsAny(ui, "/?#") {
		return fmt.Errorf("URL address %s: the user or password has a '/', '?' or '#': percent-encode it (%%2F, %%3F, %%23)", redact(addr))
	}
	u, err := url.Parse(addr)
	if err != nil {
		return fmt.Errorf("URL address %s: bad URL (reserved characters in a password must be percent-encoded)", redact(addr))
	}
	if u.RawQuery != "" || u.Fragment != "" {
		return fmt.Errorf("URL address %s: no query or fragment taken", redact(addr))
	}
	if u.Path != "" && u.Path != "/" && u.Path != "/0" {
		return fmt.Errorf("URL address %s: rain uses database 0 (path %q)", redact(addr), u.Path)
	}
	if err := checkAddr(u.Host); err != nil {
		if _, creds := userinfo(addr); creds { // what follows the '@' may be a piece of the password
			return fmt.Errorf("URL address %s: the host:port after the '@' is not valid", redact(addr))
		}
		return fmt.Errorf("URL address %s: %w", redact(addr), err)
	}
	if _, err := redis.ParseURL(addr); err != nil {
		return fmt.Errorf("URL address %s: the Redis client does not take it", redact(addr))
	}
	return nil
}

// checkAddr accepts host:port as net.SplitHostPort reads it (IPv6 hosts in
// brackets), with a non-empty host of hostname or IP characters and a decimal
// port 1–65535 without a leading zero.
func checkAddr(addr string) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("bad address: %w", err)
	}
	if host == "" {
		return fmt.Errorf("address %q: empty host", addr)
	}
	for i := 0; i < len(host); i++ {
		if c := host[i]; !isNameByte(c) && c != ':' && c != '%' {
			return fmt.Errorf("address %q: byte %q not allowed in host", addr, c)
		}
	}
	switch {
	case port == "":
		return fmt.Errorf("address %q: empty port", addr)
	case !allDigits(port):
		return fmt.Errorf("address %q: port %q is not a decimal number", addr, port)
	case len(port) > 1 && port[0] == '0':
		return fmt.Errorf("address %q: port %q has a leading zero", addr, port)
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return fmt.Errorf("address %q: port %s out of range 1-65535", addr, port)
	}
	return nil
}

func allDigits(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}
