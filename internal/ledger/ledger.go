// Package ledger is a settlement sink (settle.Sink) on a local file:
// settled grants appended to a JSON-lines file, one line per serial,
// fsynced.
package ledger

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"time"

	"rain/internal/settle"
)

// File is a settle.Sink that appends one JSON line per grant to a file and
// fsyncs it before Deliver returns. It holds exactly one line per serial,
// across redeliveries and crashes: it reads the serials already in the file
// when it opens, and cuts off a torn last line a crash may have left (that
// grant is then delivered again and written whole). A serial already in the
// file with other contents is settle.ErrSerialConflict.
//
// The grants settled unpaid (settle.RecordsUnpaid) go the same way into a
// file of their own beside it, the ledger's path with UnpaidSuffix, so
// that the ledger lists only what was paid; a serial is in one of the two,
// never both.
//
// A ledger file dedupes only what it holds: two settle workers with two
// ledgers would each pay a grant one of them took over from the other. Run
// one worker per ledger file, or use a sink that dedupes across workers (the
// wallet webhook, keyed by serial).
type File struct {
	mu     sync.Mutex             // guards f, u, seen and broken
	f, u   *os.File               // opened for append: the grants paid, and those settled unpaid
	seen   map[int64]settle.Grant // the grants in both files, by serial (Unpaid set for those of u)
	broken error                  // a failed write could not be cut off: Deliver refuses until the file is opened again
	// sync makes what was written durable: (*os.File).Sync; a test makes
	// it fail to play a disk that refuses an fsync.
	sync func(*os.File) error
}

// UnpaidSuffix names the file of the grants a ledger settled unpaid: the
// ledger's path and this.
const UnpaidSuffix = ".unpaid"

// ledgerLine is one line of the ledger.
type ledgerLine struct {
	settle.Grant
	SettledAt time.Time `json:"settled_at"`
}

// Open opens or creates the ledger at path, and the file beside it of
// the grants settled unpaid (UnpaidSuffix), which it creates only beside
// an empty ledger; a file it creates can be read and written by its owner
// alone (it lists every user paid).
func Open(path string) (*File, error) {
	l := &File{seen: map[int64]settle.Grant{}, sync: (*os.File).Sync}
	_, err := os.Stat(path)
	created := errors.Is(err, fs.ErrNotExist)
	if fi, err := os.Stat(path + UnpaidSuffix); created && err == nil && fi.Size() > 0 {
		return nil, fmt.Errorf("ledger: %s is missing beside %s, which holds grants: restore it", path, path+UnpaidSuffix)
	}
	if l.f, err = os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600); err != nil {
		return nil, fmt.Errorf("ledger: %w", err)
	}
	// A ledger that holds grants beside no file of those settled unpaid
	// has lost it (restored or moved without it), or was written before
	// rain recorded them: it is not created silently, for the grants it
	// recorded unpaid would then be paid.
	if fi, err := l.f.Stat(); err != nil || fi.Size() > 0 {
		if _, err := os.Stat(path + UnpaidSuffix); errors.Is(err, fs.ErrNotExist) {
			l.f.Close()
			return nil, fmt.Errorf("ledger: %s holds grants and %s is missing: restore it beside the ledger; if this ledger was written before rain recorded the grants it settles unpaid, create it empty (touch %s)",
				path, path+UnpaidSuffix, path+UnpaidSuffix)
		}
	}
	if _, err := os.Stat(path + UnpaidSuffix); errors.Is(err, fs.ErrNotExist) {
		created = true
	}
	if l.u, err = os.OpenFile(path+UnpaidSuffix, os.O_RDWR|os.O_CREATE, 0o600); err != nil {
		l.f.Close()
		return nil, fmt.Errorf("ledger: %w", err)
	}
	if created {
		// The files' names are durable before anything is written in them.
		if err := syncDir(filepath.Dir(path)); err != nil {
			l.f.Close()
			l.u.Close()
			return nil, err
		}
	}
	if err := l.load(); err != nil {
		l.f.Close()
		l.u.Close()
		return nil, err
	}
	return l, nil
}

// syncDir fsyncs directory dir.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("ledger: %w", err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("ledger: fsync %s: %w", dir, err)
	}
	return nil
}

// load reads the serials in both files and truncates a torn tail of each.
func (l *File) load() error {
	for _, f := range []*os.File{l.f, l.u} {
		grants, good, err := readLines(f)
		if err != nil {
			return fmt.Errorf("%w (%s)", err, f.Name())
		}
		for s, g := range grants {
			if (g.Unpaid == "") != (f == l.f) {
				return fmt.Errorf("ledger: serial %d in %s is settled %q", s, f.Name(), g.Unpaid)
			}
			if _, both := l.seen[s]; both {
				return fmt.Errorf("ledger: serial %d is both paid and settled unpaid", s)
			}
			l.seen[s] = g
		}
		if err := f.Truncate(good); err != nil {
			return fmt.Errorf("ledger: truncate torn tail: %w", err)
		}
		if _, err := f.Seek(good, io.SeekStart); err != nil {
			return fmt.Errorf("ledger: %w", err)
		}
	}
	return nil
}

// Read reads the grants the ledger at path paid, by serial, ignoring a
// torn last line. A serial on two lines is an error: the ledger holds one
// line per serial.
func Read(path string) (map[int64]settle.Grant, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("ledger: %w", err)
	}
	defer f.Close()
	grants, _, err := readLines(f)
	return grants, err
}

// readLines reads whole ledger lines from r and returns their grants by
// serial and the bytes they take; a tail without a newline is torn and not
// counted.
func readLines(r io.Reader) (map[int64]settle.Grant, int64, error) {
	br := bufio.NewReader(r)
	grants := map[int64]settle.Grant{}
	var good int64
	for {
		line, err := br.ReadBytes('\n')
		if errors.Is(err, io.EOF) {
			return grants, good, nil
		}
		if err != nil {
			return nil, 0, fmt.Errorf("ledger: read: %w", err)
		}
		var ll ledgerLine
		if jerr := json.Unmarshal(line, &ll); jerr != nil || ll.Serial <= 0 {
			return nil, 0, fmt.Errorf("ledger: line at byte %d is not a ledger line: %q", good, bytes.TrimSpace(line))
		}
		if _, dup := grants[ll.Serial]; dup {
			return nil, 0, fmt.Errorf("ledger: serial %d on two lines (the second at byte %d)", ll.Serial, good)
		}
		grants[ll.Serial] = ll.Grant
		good += int64(len(line))
	}
}

// Deliver appends the grants of gs whose serials the ledger lacks, all in
// one write and one fsync (the grants settled unpaid in their file, in one
// more): a grant already there (or twice in gs), settled the same way, is
// a repeat, another grant under a serial there (or one given both ways in
// gs, the second) settle.ErrSerialConflict. A grant to settle unpaid
// (settle.Grant.Unpaid) answers settle.ErrPaid when the ledger paid its
// serial, and a grant to pay whose serial the ledger recorded unpaid
// settle.ErrSettledUnpaid (settle.RecordsUnpaid).
func (l *File) Deliver(_ context.Context, gs []settle.Grant) []error {
	l.mu.Lock()
	defer l.mu.Unlock()
	errs := make([]error, len(gs))
	if l.broken != nil {
		for i := range errs {
			errs[i] = l.broken
		}
		return errs
	}
	type out struct {
		f     *os.File
		buf   []byte
		added []int // places in gs
	}
	outs := [2]out{{f: l.f}, {f: l.u}}
	paying := map[int64]bool{} // the serials of gs: whether their first grant is to pay
	now := time.Now().UTC()
	for i, g := range gs {
		if pay, met := paying[g.Serial]; met && pay != (g.Unpaid == "") {
			errs[i] = fmt.Errorf("%w: serial %d given both to pay and unpaid, %s", settle.ErrSerialConflict, g.Serial, g)
			continue
		}
		paying[g.Serial] = g.Unpaid == ""
		if g.Serial <= 0 {
			errs[i] = fmt.Errorf("ledger: serial %d: a ledger line needs a positive serial", g.Serial)
			continue
		}
		if had, ok := l.seen[g.Serial]; ok {
			switch {
			case !had.Same(g):
				errs[i] = fmt.Errorf("%w: serial %d was settled for %s, now %s", settle.ErrSerialConflict, g.Serial, had, g)
			case had.Unpaid == "" && g.Unpaid != "":
				errs[i] = fmt.Errorf("%w: serial %d, %s", settle.ErrPaid, g.Serial, g)
			case had.Unpaid != "" && g.Unpaid == "":
				errs[i] = fmt.Errorf("%w (%s): serial %d, %s", settle.ErrSettledUnpaid, had.Unpaid, g.Serial, g)
			}
			continue
		}
		b, err := json.Marshal(ledgerLine{Grant: g, SettledAt: now})
		if err != nil {
			errs[i] = err
			continue
		}
		o := &outs[0]
		if g.Unpaid != "" {
			o = &outs[1]
		}
		o.buf = append(append(o.buf, b...), '\n')
		o.added = append(o.added, i)
		l.seen[g.Serial] = g // a second copy in gs is a repeat of this one
	}
	for _, o := range outs {
		if len(o.added) == 0 {
			continue
		}
		if err := l.append(o.f, o.buf); err != nil {
			for _, i := range o.added {
				delete(l.seen, gs[i].Serial)
				errs[i] = err // delivered again later; what was written is read back at open
			}
		}
	}
	// A repeat within gs shares its first grant's fate.
	first := map[int64]int{}
	for i, g := range gs {
		if f, ok := first[g.Serial]; !ok {
			first[g.Serial] = i
		} else if errs[i] == nil {
			errs[i] = errs[f]
		}
	}
	return errs
}

// append writes buf to f (one of l's files) and fsyncs it. A write or an
// fsync that fails is cut off: the file ends where it ended before, so the
// grants are written again whole when delivered again, and never twice (a
// line the failed fsync left in the file, written again, would put its
// serial on two lines: a ledger that no longer opens). l.mu is held.
func (l *File) append(f *os.File, buf []byte) error {
	end, err := f.Seek(0, io.SeekCurrent)
	if err != nil {
		return fmt.Errorf("ledger: %w", err)
	}
	cut := func(err error) error {
		terr := f.Truncate(end)
		if terr == nil {
			_, terr = f.Seek(end, io.SeekStart)
		}
		if terr != nil {
			// What failed may be in the file: writing it again would put a
			// serial on two lines. Nothing more is written until the file
			// is opened again (which reads what it holds).
			l.broken = fmt.Errorf("ledger: a failed write could not be cut off (%w): reopen the ledger", terr)
			err = errors.Join(err, l.broken)
		}
		return err
	}
	if _, err := f.Write(buf); err != nil {
		return fmt.Errorf("ledger: write: %w", cut(err))
	}
	if err := l.sync(f); err != nil {
		return fmt.Errorf("ledger: fsync: %w", cut(err))
	}
	return nil
}

// RecordsUnpaid reports that the ledger records the grants settled unpaid:
// settle.RecordsUnpaid.
func (l *File) RecordsUnpaid() bool { return true }

// Close closes the files.
func (l *File) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return errors.Join(l.f.Close(), l.u.Close())
}
