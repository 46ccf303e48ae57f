package shard

// This file keeps shard passwords out of errors and logs: addresses and
// items are shown with their credentials masked, or not at all when a part
// of them may be a piece of a password.

import (
	"fmt"
	"strconv"
	"strings"
)

// hasPrefixFold is strings.HasPrefix, ASCII case-insensitive.
func hasPrefixFold(s, prefix string) bool {
	return len(s) >= len(prefix) && strings.EqualFold(s[:len(prefix)], prefix)
}

// credMarkers start the addresses that may hold credentials (matched
// ASCII case-insensitively).
var credMarkers = [...]string{"redis://", "rediss://", sentinelPrefix, sentinelTLSPrefix, clusterPrefix, clusterTLSPrefix}

// credStart returns the length of addr's marker (see credMarkers), 0 when
// it has none.
func credStart(addr string) int {
	for _, m := range credMarkers {
		if hasPrefixFold(addr, m) {
			return len(m)
		}
	}
	return 0
}

// notShown stands for a part of an address an error does not show.
const notShown = "(not shown: not a valid address)"

// redact masks the credentials of a URL or sentinel address. It does not
// parse the address (a password with an unencoded '/', '?' or '#' would end
// a parsed URL's authority early and show in its path, query or fragment):
// everything between the scheme and the last '@' is user information, which
// no host holds; what follows the user name's ':' there is masked, or the
// whole of it when it has no ':' (a password written where the user goes).
// What follows the '@', or an address with no '@', is shown only when it
// reads as an address: else it may be a piece of a password that an
// unencoded ',' (the list's separator) or '@' cut.
func redact(addr string) string {
	n := credStart(addr)
	if n == 0 {
		return addr
	}
	rest := addr[n:]
	at := strings.LastIndexByte(rest, '@')
	if at < 0 {
		if !readable(addr[:n], rest) {
			return addr[:n] + notShown
		}
		return addr
	}
	tail := rest[at:]
	if !readable(addr[:n], rest[at+1:]) {
		tail = "@" + notShown
	}
	user, _, hasPassword := strings.Cut(rest[:at], ":")
	if !hasPassword {
		return addr[:n] + "xxxxx" + tail
	}
	return addr[:n] + user + ":xxxxx" + tail
}

// readable reports whether what follows marker (and the user information,
// if any) is well formed, and so holds no piece of a password: a URL's
// host:port (with a path, query or fragment, which hold none), a sentinel
// form's master name and sentinel host:ports, or a cluster form's seeds.
func readable(marker, after string) bool {
	if strings.EqualFold(marker, clusterPrefix) || strings.EqualFold(marker, clusterTLSPrefix) {
		for _, a := range strings.Split(after, "+") {
			if checkAddr(a) != nil {
				return false
			}
		}
		return true
	}
	if strings.EqualFold(marker, sentinelPrefix) || strings.EqualFold(marker, sentinelTLSPrefix) {
		master, list, ok := strings.Cut(after, "/")
		if !ok || master == "" || strings.IndexFunc(master, func(r rune) bool { return r > 127 || !isNameByte(byte(r)) }) >= 0 {
			return false
		}
		for _, a := range strings.Split(list, "+") {
			if checkAddr(a) != nil {
				return false
			}
		}
		return true
	}
	host, _, _ := strings.Cut(after, "/")
	if i := strings.IndexAny(host, "?#"); i >= 0 {
		host = host[:i]
	}
	return checkAddr(host) == nil
}

// userinfo returns the user information of a URL address as redact finds
// it (before the last '@'), and whether it has any.
func userinfo(addr string) (string, bool) {
	_, rest, _ := strings.Cut(addr, "://")
	at := strings.LastIndexByte(rest, '@')
	if at < 0 {
		return "", false
	}
	return rest[:at], true
}

// describeItem names item i of n for an error: quoted, its address's
// credentials masked; by its place alone when it has no marked address
// but an '@' that may end a password's piece (an '@' before its '=', or
// a second one).
func describeItem(item string, i, n int) string {
	if markedAddr(item) >= 0 {
		return strconv.Quote(redactItem(item))
	}
	eq, at := strings.IndexByte(item, '='), strings.IndexByte(item, '@')
	if at >= 0 && (eq < 0 || at < eq || strings.Count(item, "@") > 1) {
		return fmt.Sprintf("%d of %d (not shown: it may hold a piece of a password)", i+1, n)
	}
	return strconv.Quote(item)
}

// markedAddr returns where the first URL or sentinel address starts in
// item, wherever it is (a name or weight left out moves it); -1 if none.
func markedAddr(item string) int {
	for i := range len(item) {
		if credStart(item[i:]) > 0 {
			return i
		}
	}
	return -1
}

// redactItem masks the credentials of an item's address, for errors.
func redactItem(item string) string {
	i := markedAddr(item)
	if i < 0 {
		return item
	}
	return item[:i] + redact(item[i:])
}
