package shard

import (
	"net"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

func TestParseSpecs(t *testing.T) {
	name64 := strings.Repeat("n", 64)
	tests := []struct {
		name string
		in   string
		want []Spec
	}{
		{"two", "s1=1@127.0.0.1:7001,s2=2@127.0.0.1:7002", []Spec{
			{"s1", 1, "127.0.0.1:7001"}, {"s2", 2, "127.0.0.1:7002"},
		}},
		{"spaces around items", " s1=1@h:1 ,\ts2=1000@redis-2.internal:6379\n", []Spec{
			{"s1", 1, "h:1"}, {"s2", 1000, "redis-2.internal:6379"},
		}},
		{"order kept", "b=1@h:2,a=1@h:1", []Spec{{"b", 1, "h:2"}, {"a", 1, "h:1"}}},
		{"all name bytes", "a_b.c-D9=7@host:65535", []Spec{{"a_b.c-D9", 7, "host:65535"}}},
		{"64-byte name", name64 + "=1@h:1", []Spec{{name64, 1, "h:1"}}},
		{"ipv6", "s1=1@[::1]:6379", []Spec{{"s1", 1, "[::1]:6379"}}},
		{"ipv6 zone", "s1=1@[fe80::1%eth0]:6379", []Spec{{"s1", 1, "[fe80::1%eth0]:6379"}}},
		{"port 1", "s1=1@h:1", []Spec{{"s1", 1, "h:1"}}},
		{"sentinel", "s1=1@sentinel/m-1/10.0.0.1:26379+10.0.0.2:26379,s2=1@h:2", []Spec{
			{"s1", 1, "sentinel/m-1/10.0.0.1:26379+10.0.0.2:26379"}, {"s2", 1, "h:2"},
		}},
		{"sentinel over TLS", "s1=1@sentinel+tls/m-1/10.0.0.1:26379+10.0.0.2:26379", []Spec{
			{"s1", 1, "sentinel+tls/m-1/10.0.0.1:26379+10.0.0.2:26379"},
		}},
		{"a cluster beside a shard", "c1=3@cluster/10.0.0.5:7000+10.0.0.6:7000+10.0.0.7:7000,s2=1@h:2", []Spec{
			{"c1", 3, "cluster/10.0.0.5:7000+10.0.0.6:7000+10.0.0.7:7000"}, {"s2", 1, "h:2"},
		}},
		{"a cluster over TLS with AUTH", "c1=1@cluster+tls/rain:pw@10.0.0.5:7000", []Spec{
			{"c1", 1, "cluster+tls/rain:pw@10.0.0.5:7000"},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseSpecs(tt.in)
			if err != nil {
				t.Fatalf("ParseSpecs(%q) error: %v", tt.in, err)
			}
			if !slices.Equal(got, tt.want) {
				t.Fatalf("ParseSpecs(%q) = %v, want %v", tt.in, got, tt.want)
			}
		})
	}
}

func TestParseSpecsErrors(t *testing.T) {
	const H = "sentinel/(not shown: not a valid address)"
	tests := []struct {
		in   string
		want string // the whole error message, or its part after `...: ` when prefix
	}{
		{"", "shard specs: none given (want name=weight@host:port,...)"},
		{" \t", "shard specs: none given (want name=weight@host:port,...)"},
		{"s1=1@h:1,", "shard spec 2 of 2: empty (stray comma?)"},
		{",s1=1@h:1", "shard spec 1 of 2: empty (stray comma?)"},
		{"s1=1@h:1, ,s2=1@h:2", "shard spec 2 of 3: empty (stray comma?)"},
		{"s1", `shard spec "s1": missing "=" after the name (want name=weight@host:port)`},
		// A sentinel form that does not read as one is not shown: it may be
		// a piece of a password an unencoded ',' cut.
		{"s1=1@sentinel/m", `shard spec "s1=1@` + H + `": sentinel address "` + H + `": want sentinel/[USER:PASSWORD@]MASTER/ (or sentinel+tls/...) and the sentinels' host:port joined by +`},
		{"s1=1@sentinel//h:1", `shard spec "s1=1@` + H + `": sentinel address "` + H + `": want sentinel/[USER:PASSWORD@]MASTER/ (or sentinel+tls/...) and the sentinels' host:port joined by +`},
		{"s1=1@sentinel/m m/h:1", `shard spec "s1=1@` + H + `": sentinel address "` + H + `": master name byte ' ' not allowed (want A-Z a-z 0-9 _ . -)`},
		{"s1=1@sentinel/m/h:1+h", `shard spec "s1=1@` + H + `": sentinel address "` + H + `": bad address: address h: missing port in address`},
		{"s1=1@sentinel+tls/m", `shard spec "s1=1@sentinel+tls/(not shown: not a valid address)": sentinel address "sentinel+tls/(not shown: not a valid address)": want sentinel/[USER:PASSWORD@]MASTER/ (or sentinel+tls/...) and the sentinels' host:port joined by +`},
		{"s1=1@cluster/", `shard spec "s1=1@cluster/(not shown: not a valid address)": cluster address "cluster/(not shown: not a valid address)": want cluster/[USER:PASSWORD@] (or cluster+tls/...) and seed nodes' host:port joined by +`},
		{"c1=1@cluster/h:1+h", `shard spec "c1=1@cluster/(not shown: not a valid address)": cluster address "cluster/(not shown: not a valid address)": bad address: address h: missing port in address`},
		{"c1=1@cluster/rain:s3cret@h:1+h", `shard spec "c1=1@cluster/rain:xxxxx@(not shown: not a valid address)": cluster address "cluster/rain:xxxxx@(not shown: not a valid address)": a seed host:port after the '@' is not valid`},
		{"c1=1@cluster/a/b:pw@h:1", `shard spec "c1=1@cluster/a/b:xxxxx@h:1": cluster address "cluster/a/b:xxxxx@h:1": the user or password has a '/': percent-encode it (%2F)`},
		{"s1=1", `shard spec "s1=1": missing "@" after the weight (want name=weight@host:port)`},
		{"s1@h:1=1", `shard spec 1 of 1 (not shown: it may hold a piece of a password): missing "@" after the weight (want name=weight@host:port)`},
		{"=1@h:1", `shard spec "=1@h:1": empty name`},
		{"s 1=1@h:1", `shard spec "s 1=1@h:1": name "s 1": byte ' ' not allowed (want A-Z a-z 0-9 _ . -)`},
		{"s#1=1@h:1", `shard spec "s#1=1@h:1": name "s#1": byte '#' not allowed (want A-Z a-z 0-9 _ . -)`},
		{strings.Repeat("n", 65) + "=1@h:1", `name is 65 bytes, longer than 64`},
		{"s1=0@h:1", `shard spec "s1=0@h:1": weight 0 out of range 1-1000`},
		{"s1=1001@h:1", `shard spec "s1=1001@h:1": weight 1001 out of range 1-1000`},
		{"s1=99999999999999999999@h:1", `weight 99999999999999999999 out of range 1-1000`},
		{"s1=@h:1", `shard spec "s1=@h:1": empty weight`},
		{"s1=-1@h:1", `weight "-1" is not a decimal integer`},
		{"s1=+1@h:1", `weight "+1" is not a decimal integer`},
		{"s1= 1@h:1", `weight " 1" is not a decimal integer`},
		{"s1=1 @h:1", `weight "1 " is not a decimal integer`},
		{"s1=1.5@h:1", `weight "1.5" is not a decimal integer`},
		{"s1=0x10@h:1", `weight "0x10" is not a decimal integer`},
		{"s1=01@h:1", `weight "01" has a leading zero`},
		{"s1=1@h", `shard spec "s1=1@h": bad address: address h: missing port in address`},
		{"s1=1@", `bad address: missing port in address`},
		{"s1=1@::1:6379", `bad address: address ::1:6379: too many colons in address`},
		{"s1=1@:6379", `shard spec "s1=1@:6379": address ":6379": empty host`},
		{"s1=1@[]:6379", `address "[]:6379": empty host`},
		{"s1=1@h:", `address "h:": empty port`},
		{"s1=1@h:0", `address "h:0": port 0 out of range 1-65535`},
		{"s1=1@h:65536", `address "h:65536": port 65536 out of range 1-65535`},
		{"s1=1@h:99999999999999999999999", `port 99999999999999999999999 out of range 1-65535`},
		{"s1=1@h:http", `address "h:http": port "http" is not a decimal number`},
		{"s1=1@h:-1", `port "-1" is not a decimal number`},
		{"s1=1@h:+1", `port "+1" is not a decimal number`},
		{"s1=1@h:080", `port "080" has a leading zero`},
		{"s1=1@h h:1", `address "h h:1": byte ' ' not allowed in host`},
		{"s1=1@ h:1,s2=1@h:2", `shard spec "s1=1@ h:1": address " h:1": byte ' ' not allowed in host`},
		{"s1=1@a@b:1", `shard spec 1 of 1 (not shown: it may hold a piece of a password): an address with an '@' that is not redis://, rediss://, sentinel/, sentinel+tls/, cluster/ or cluster+tls/ (not shown: it may hold a password)`},
		{"s1=1@h:1,s1=2@h:2", `shard spec "s1=2@h:2": duplicate name "s1"`},
		{"s1=1@h:1,s2=1@h:2,s1=1@h:1", `shard spec "s1=1@h:1": duplicate name "s1"`},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := ParseSpecs(tt.in)
			if err == nil {
				t.Fatalf("ParseSpecs(%q) = %v, want error %q", tt.in, got, tt.want)
			}
			if msg := err.Error(); msg != tt.want && !strings.HasSuffix(msg, ": "+tt.want) {
				t.Fatalf("ParseSpecs(%q) error %q, want %q", tt.in, msg, tt.want)
			}
			if !strings.HasPrefix(err.Error(), "shard spec") {
				t.Fatalf("ParseSpecs(%q) error %q does not start with %q", tt.in, err, "shard spec")
			}
		})
	}
}

func TestSpecString(t *testing.T) {
	tests := []struct {
		spec Spec
		want string
	}{
		{Spec{"s1", 2, "10.0.0.5:6379"}, "s1=2@10.0.0.5:6379"},
		{Spec{"a.b", 1000, "[::1]:1"}, "a.b=1000@[::1]:1"},
	}
	for _, tt := range tests {
		if got := tt.spec.String(); got != tt.want {
			t.Errorf("%#v.String() = %q, want %q", tt.spec, got, tt.want)
		}
		got, err := ParseSpecs(tt.spec.String())
		if err != nil || len(got) != 1 || got[0] != tt.spec {
			t.Errorf("ParseSpecs(%q) = %v, %v, want [%v]", tt.spec.String(), got, err, tt.spec)
		}
	}
}

// FuzzURLPassword: whatever a shard URL's (or sentinel form's) password holds (but a ',', which
// ends the item: see TestURLErrorsHideThePassword), an error about the spec
// never shows it, nor String of a spec it yields.
func FuzzURLPassword(f *testing.F) {
	for _, p := range []string{"", "pw", "a/b", "a?b", "a#b", "a@b", "%zz", "a:b", "12/34", "::", "@@", "a b"} {
		f.Add(p, "h:1", "s1=1@")
	}
	f.Add("pw", "h:99999", "s1=1@")
	f.Add("pw", "h:1/2", "s1=1@")
	f.Add("pw", "h:1?x", "s1=1@")
	f.Add("pw", "h:1", "s1=")
	f.Add("pw", "h:1", "")
	f.Add("pw", "h:1", "x@y")
	f.Fuzz(func(t *testing.T, p, rest, head string) {
		// Shape the inputs rather than skip them: a ',' ends the item, the
		// markers Q7 and Z9 must be the secret's alone, an '@' after the
		// secret or an address before it would make another spec.
		clean := func(s string, drop ...string) string {
			for again := true; again; { // until no removal makes a new one
				again = false
				for _, d := range drop {
					if strings.Contains(s, d) {
						s, again = strings.ReplaceAll(s, d, ""), true
					}
				}
			}
			return s
		}
		p, rest, head = clean(p, ",", "Q7", "Z9"), clean(rest, ",", "Q7", "Z9", "@"), clean(head, ",", "Q7", "Z9")
		for i := markedAddr(head); i >= 0; i = markedAddr(head) {
			head = clean(head[:i]+head[i+1:], ",", "Q7", "Z9")
		}
		secret := "Q7" + p + "Z9" // markers nothing else in an error holds
		specs := []string{
			"s1=1@redis://u:" + secret + "@" + rest, "s1=1@sentinel/u:" + secret + "@m/" + rest,
			head + "rediss://u:" + secret + "@" + rest, head + "sentinel/:" + secret + "@m/" + rest,
			"s1=1@sentinel+tls/u:" + secret + "@m/" + rest, head + "sentinel+tls/:" + secret + "@m/" + rest,
		}
		if !strings.Contains(p, ":") { // a password written where the user goes
			specs = append(specs, head+"sentinel/"+secret+"@m/"+rest, head+"redis://"+secret+"@"+rest, head+"sentinel+tls/"+secret+"@m/"+rest)
		}
		for _, spec := range specs {
			specs, err := ParseSpecs(spec)
			if err != nil {
				if strings.Contains(err.Error(), "Q7") || strings.Contains(err.Error(), "Z9") {
					t.Fatalf("error %q shows the password %q", err, secret)
				}
				continue
			}
			if s := specs[0].String(); strings.Contains(s, "Q7") || strings.Contains(s, "Z9") {
				t.Fatalf("String() = %q shows the password %q", s, secret)
			}
		}
	})
}

func FuzzParseShards(f *testing.F) {
	for _, s := range []string{
		"s1=1@127.0.0.1:7001,s2=2@127.0.0.1:7002",
		" s1=1@h:1 , s2=1000@redis-2.internal:6379 ",
		"a_b.c-D9=7@[::1]:6379",
		"x=1@[fe80::1%eth0]:65535",
		"s1=0@h:1", "s1=01@h:1", "s1=+1@h:1", "s1=1@h:0", "s1=1@h:080",
		"s1=1@h:1,", ",", "", "s1", "s1=1", "=@:", "s1=1@h:1,s1=1@h:1",
		"s1=1@a@b:1", "s1=1@::1:6379", "s1=1@[]:1", "s1=1@h:99999999999",
		"c1=3@cluster/10.0.0.5:7000+10.0.0.6:7000", "c1=1@cluster+tls/u:p@h:1", "c1=1@cluster/", "c1=1@cluster/h:1+",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		specs, err := ParseSpecs(s)
		if err != nil {
			if !strings.HasPrefix(err.Error(), "shard spec") {
				t.Fatalf("ParseSpecs(%q) error %q does not start with %q", s, err, "shard spec")
			}
			return
		}
		if len(specs) == 0 {
			t.Fatalf("ParseSpecs(%q) = no specs and no error", s)
		}
		if n := strings.Count(s, ",") + 1; len(specs) != n {
			t.Fatalf("ParseSpecs(%q) = %d specs, want %d (one per item)", s, len(specs), n)
		}
		seen := make(map[string]bool)
		texts := make([]string, len(specs))
		for i, sp := range specs {
			if why := breaksRules(sp); why != "" {
				t.Fatalf("ParseSpecs(%q) gave %#v: %s", s, sp, why)
			}
			if seen[sp.Name] {
				t.Fatalf("ParseSpecs(%q) gave name %q twice", s, sp.Name)
			}
			seen[sp.Name] = true
			texts[i] = sp.String()
		}
		joined := strings.Join(texts, ",")
		again, err := ParseSpecs(joined)
		if err != nil {
			t.Fatalf("ParseSpecs(%q) (reformatted from %q) error: %v", joined, s, err)
		}
		for i := range again {
			// String masks a password: what parses again is the masked spec.
			if again[i].String() != specs[i].String() || again[i].Name != specs[i].Name || again[i].Weight != specs[i].Weight {
				t.Fatalf("ParseSpecs(%q) = %v, want %v (as parsed from %q)", joined, again, specs, s)
			}
		}
		if _, err := NewRing(specs, 1); err != nil {
			t.Fatalf("NewRing(ParseSpecs(%q)) error: %v", s, err)
		}
	})
}

var nameRE = regexp.MustCompile(`^[A-Za-z0-9_.-]{1,64}$`)

// breaksRules checks sp against the spec rules, written out independently of
// the parser; it returns what is wrong, or "".
func breaksRules(sp Spec) string {
	if !nameRE.MatchString(sp.Name) {
		return "bad name"
	}
	if sp.Weight < 1 || sp.Weight > 1000 {
		return "weight out of range"
	}
	if cl, ok := sp.Cluster(); ok {
		if len(cl.Seeds) == 0 {
			return "a cluster without seeds"
		}
		for _, seed := range cl.Seeds {
			if why := breaksRules(Spec{Name: sp.Name, Weight: sp.Weight, Addr: seed}); why != "" {
				return "seed " + why
			}
		}
		return ""
	}
	host, port, err := net.SplitHostPort(sp.Addr)
	if err != nil {
		return "address: " + err.Error()
	}
	if host == "" || strings.ContainsAny(host, " \t\r\n,@=") {
		return "bad host"
	}
	p, err := strconv.Atoi(port)
	if err != nil || p < 1 || p > 65535 || strconv.Itoa(p) != port {
		return "bad port"
	}
	if strings.TrimSpace(sp.Addr) != sp.Addr {
		return "address not trimmed"
	}
	return ""
}

func TestCluster(t *testing.T) {
	cl, ok := Spec{Addr: "cluster/a:1+b:2+c:3"}.Cluster()
	if !ok || !slices.Equal(cl.Seeds, []string{"a:1", "b:2", "c:3"}) || cl.TLS || cl.Username != "" || cl.Password != "" {
		t.Fatalf("Cluster() = %+v %v, want [a:1 b:2 c:3], no TLS, no AUTH", cl, ok)
	}
	cl, ok = Spec{Addr: "cluster+tls/rain:p%2Fw@d@a:1"}.Cluster()
	if !ok || !cl.TLS || cl.Username != "rain" || cl.Password != "p/w@d" || !slices.Equal(cl.Seeds, []string{"a:1"}) {
		t.Fatalf("Cluster() with TLS and credentials = %+v %v, want TLS, rain, p/w@d, [a:1]", cl, ok)
	}
	for _, addr := range []string{"h:1", "sentinel/m/a:1", "redis://h:1"} {
		if _, ok := (Spec{Addr: addr}).Cluster(); ok {
			t.Fatalf("Cluster() of %s = true", addr)
		}
	}
	if s := (Spec{Name: "c1", Weight: 2, Addr: "cluster/rain:s3cret@a:1+b:2"}).String(); s != "c1=2@cluster/rain:xxxxx@a:1+b:2" {
		t.Fatalf("String() = %q, want the password masked", s)
	}
}

func TestSentinel(t *testing.T) {
	sh, ok := Spec{Addr: "sentinel/mymaster/a:1+b:2+c:3"}.Sentinel()
	if !ok || sh.Master != "mymaster" || !slices.Equal(sh.Sentinels, []string{"a:1", "b:2", "c:3"}) || sh.Password != "" {
		t.Fatalf("Sentinel() = %+v %v, want mymaster [a:1 b:2 c:3] true", sh, ok)
	}
	sh, ok = Spec{Addr: "sentinel/rain:p%2Fw@d@mymaster/a:1"}.Sentinel()
	if !ok || sh.Username != "rain" || sh.Password != "p/w@d" || sh.Master != "mymaster" || !slices.Equal(sh.Sentinels, []string{"a:1"}) {
		t.Fatalf("Sentinel() with credentials = %+v %v, want rain, p/w@d, mymaster [a:1]", sh, ok)
	}
	if _, ok := (Spec{Addr: "h:1"}).Sentinel(); ok {
		t.Fatal("Sentinel() of a plain address = true")
	}
	if sh.TLS {
		t.Fatal("Sentinel() of sentinel/... says TLS")
	}
	sh, ok = Spec{Addr: "sentinel+tls/rain:pw@mymaster/a:1+b:2"}.Sentinel()
	if !ok || !sh.TLS || sh.Username != "rain" || sh.Password != "pw" || sh.Master != "mymaster" || !slices.Equal(sh.Sentinels, []string{"a:1", "b:2"}) {
		t.Fatalf("Sentinel() of sentinel+tls/... = %+v %v, want TLS, rain, pw, mymaster [a:1 b:2]", sh, ok)
	}
}

// TestURLErrorsHideThePassword: whatever is wrong with a URL address, and
// whatever its password holds (a '/', '?', '#' or '@' left unencoded, which
// ends a parsed URL's authority early), an error or String shows the user
// but never the password.
func TestURLErrorsHideThePassword(t *testing.T) {
	// Items whose name or weight was left out: the address is found
	// wherever it starts, and a weight quoted in the error is masked too.
	for _, c := range []struct{ spec, secret string }{
		{"rediss://u:secretZ@h:1", "secretZ"},
		{"s1=rediss://u:secretZ@h:1", "secretZ"},
		{"sentinel/u:secretZ@m/h:1", "secretZ"},
		{"s1=sentinel/u:secretZ@m/h:1", "secretZ"},
		{"s1=1@redis://secretZ@h:99999", "secretZ"},
		{"s1=1@sentinel/secretZ@m m/h:1", "secretZ"},
		// A ',' or '@' left unencoded in a password cuts it into pieces;
		// no piece shows, whichever item or part it lands in.
		{"s=1@redis://u:1234,S3cretPW@h:6379", "S3cretPW"},
		{"s=1@redis://u:p@S3cret,PW@h:6379", "S3cret"},
		{"s=1@sentinel/S3cret,PW@m/h:1", "S3cret"},
		// A scheme in capitals, or none, or a mistyped one.
		{"s=1@REDIS://u:S3cretPW@h:99999", "S3cretPW"},
		{"s=1@u:S3cretPW@h:1", "S3cretPW"},
		{"s=1@redis:/u:S3cretPW@h", "S3cretPW"},
		{"s=1@SENTINEL/u:S3cretPW@m/h:1", "S3cretPW"},
	} {
		_, err := ParseSpecs(c.spec)
		if err == nil || strings.Contains(err.Error(), c.secret) {
			t.Errorf("%s: error %v; want one that does not show %q", c.spec, err, c.secret)
		}
	}

	for _, c := range []struct {
		addr, secret, want string
	}{
		{"redis://u:12/3456@h:1", "3456", "percent-encode"},
		{"redis://u:12?3456@h:1", "3456", "percent-encode"},
		{"rediss://u:12#3456@h:1", "3456", "percent-encode"},
		{"redis://u:pa/zq@h:1", "zq", "percent-encode"},
		{"redis://u:s3cret@h:1/2", "s3cret", "database 0"},
		{"redis://u:s3cret@h:1?db=1", "s3cret", "no query"},
		{"redis://u:s3cret@h:1#frag", "s3cret", "no query"},
		{"redis://u:s3cret@h:99999", "s3cret", "host:port after the '@' is not valid"},
		{"redis://u:s3cret@h", "s3cret", "host:port after the '@' is not valid"},
		{"redis://u:s3%zzcret@h:1", "cret", "bad URL"},
		{"redis://u:s3cret@:1", "s3cret", "host:port after the '@' is not valid"},
		{"redis://u:s3,cret@h:1", "s3", "not shown"}, // the ',' ends the item
		{"sentinel/u:se/cret@m/h:1", "cret", "percent-encode"},
		{"sentinel/u:s3cret@m m/h:1", "s3cret", "master name"},
		{"sentinel/u:s3cret@m/h", "s3cret", "host:port after the '@' is not valid"},
		{"sentinel/u:s3%zzcret@m/h:1", "cret", "percent-encoding"},
		{"sentinel/u:s3cret@m", "s3cret", "want sentinel/"},
		{"sentinel/u:s3,cretZ@m/h:1", "s3", "not shown"}, // the ',' ends the item
	} {
		_, err := ParseSpecs("s1=1@" + c.addr)
		if err == nil {
			t.Errorf("%s: accepted, want an error", c.addr)
			continue
		}
		if msg := err.Error(); strings.Contains(msg, c.secret) || !strings.Contains(msg, c.want) ||
			(!strings.Contains(msg, "u:xxxxx@") && !strings.Contains(msg, "not shown")) {
			t.Errorf("%s: error %q; want it to say %q and show u:xxxxx@, never %q", c.addr, msg, c.want, c.secret)
		}
	}
	for _, c := range []struct{ spec, want string }{
		{"s1=1@redis://u:p%2Fw@h:1", "s1=1@redis://u:xxxxx@h:1"},
		{"s1=1@rediss://u:p@w@h:1", "s1=1@rediss://u:xxxxx@h:1"},
		{"s1=1@redis://u@h:1", "s1=1@redis://xxxxx@h:1"}, // maybe a password where the user goes
		{"s1=1@redis://h:1", "s1=1@redis://h:1"},
		{"s1=1@sentinel/u:p%2Fw@m/h:1+h:2", "s1=1@sentinel/u:xxxxx@m/h:1+h:2"},
		{"s1=1@sentinel/:pw@m/h:1", "s1=1@sentinel/:xxxxx@m/h:1"},
		{"s1=1@sentinel/m/h:1", "s1=1@sentinel/m/h:1"},
		{"s1=1@REDIS://u:S3cretPW@h:1", "s1=1@REDIS://u:xxxxx@h:1"},
	} {
		specs, err := ParseSpecs(c.spec)
		if err != nil {
			t.Errorf("%s: %v", c.spec, err)
			continue
		}
		if got := specs[0].String(); got != c.want {
			t.Errorf("%s: String() = %q, want %q", c.spec, got, c.want)
		}
	}
}
