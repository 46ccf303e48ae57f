package redisproxy

// This file reads RESP: the commands clients send and the replies Redis
// sends back.

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
)

// errProtocol is returned for bytes that are not RESP.
var errProtocol = errors.New("redisproxy: not RESP")

// readCommand reads one command: a RESP array of bulk strings, or an inline
// command line. It returns the raw bytes and the argv, argv[0] upper-cased.
func readCommand(r *bufio.Reader) (raw []byte, cmd []string, err error) {
	line, err := r.ReadBytes('\n')
	if err != nil {
		return nil, nil, err
	}
	raw = line
	if len(line) == 0 || line[0] != '*' {
		cmd = strings.Fields(string(line))
		if len(cmd) == 0 {
			cmd = []string{""}
		}
		cmd[0] = strings.ToUpper(cmd[0])
		return raw, cmd, nil
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(line[1:])))
	if err != nil || n < 0 {
		return nil, nil, fmt.Errorf("%w: array header %q", errProtocol, line)
	}
	cmd = make([]string, 0, n)
	for range n {
		hdr, err := r.ReadBytes('\n')
		if err != nil {
			return nil, nil, err
		}
		if len(hdr) == 0 || hdr[0] != '$' {
			return nil, nil, fmt.Errorf("%w: bulk header %q", errProtocol, hdr)
		}
		size, err := strconv.Atoi(strings.TrimSpace(string(hdr[1:])))
		if err != nil || size < 0 {
			return nil, nil, fmt.Errorf("%w: bulk header %q", errProtocol, hdr)
		}
		body := make([]byte, size+2)
		if _, err := io.ReadFull(r, body); err != nil {
			return nil, nil, err
		}
		raw = append(raw, hdr...)
		raw = append(raw, body...)
		cmd = append(cmd, string(body[:size]))
	}
	if len(cmd) == 0 {
		cmd = []string{""}
	}
	cmd[0] = strings.ToUpper(cmd[0])
	return raw, cmd, nil
}

// readReply reads one complete RESP2 or RESP3 reply and returns its bytes.
func readReply(r *bufio.Reader) ([]byte, error) {
	var raw []byte
	var read func() error
	read = func() error {
		line, err := r.ReadBytes('\n')
		if err != nil {
			return err
		}
		raw = append(raw, line...)
		if len(line) < 3 {
			return fmt.Errorf("%w: short line %q", errProtocol, line)
		}
		body := strings.TrimSpace(string(line[1:]))
		switch line[0] {
		case '+', '-', ':', '_', ',', '#', '(':
			return nil
		case '$', '!', '=':
			n, err := strconv.Atoi(body)
			if err != nil {
				return fmt.Errorf("%w: %q", errProtocol, line)
			}
			if n < 0 {
				return nil // null bulk string
			}
			buf := make([]byte, n+2)
			if _, err := io.ReadFull(r, buf); err != nil {
				return err
			}
			raw = append(raw, buf...)
			return nil
		case '*', '~', '>', '%', '|':
			n, err := strconv.Atoi(body)
			if err != nil {
				return fmt.Errorf("%w: %q", errProtocol, line)
			}
			if line[0] == '%' || line[0] == '|' {
				n *= 2
			}
			for range max(n, 0) { // a null array (*-1) has no elements
				if err := read(); err != nil {
					return err
				}
			}
			if line[0] == '|' { // an attribute precedes the reply it annotates
				return read()
			}
			return nil
		}
		return fmt.Errorf("%w: type %q", errProtocol, line[0])
	}
	if err := read(); err != nil {
		return nil, err
	}
	return raw, nil
}
