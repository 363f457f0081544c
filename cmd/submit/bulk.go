package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/keylane/keylane"
	"github.com/keylane/keylane/internal/progress"
)

// bulkLine is one line of `submit bulk`'s input.
type bulkLine struct {
	Key string `json:"key"`
	// Payload is the job's payload: a JSON string's text, or any other
	// JSON value as it is written.
	Payload json.RawMessage `json:"payload"`
	ID      string          `json:"id"`
	Type    string          `json:"type"`
}

// bulkChunk is how many lines go to one SubmitMany: its jobs are in
// flight together (the client's MaxPending bounds the publishes), and an
// interrupt leaves at most this many of unknown fate.
const bulkChunk = 1024

// maxLine bounds one input line; NATS refuses a payload above the
// server's max_payload (1 MiB by default) anyway.
const maxLine = 8 << 20

// bulk submits the JSON lines of a file (or stdin) fire-and-forget. A
// line that is not a job (bad JSON, an unknown field, no key) or that the
// client refuses (a key too long, a bad ID) is reported with its number
// and nothing is stored for it; every other line is stored. It ends with
// how many were stored, also when interrupted.
func bulk(ctx context.Context, args []string, out, errOut io.Writer) error {
	fs := flag.NewFlagSet("bulk", flag.ContinueOnError)
	var c common
	c.register(fs, false)
	file := fs.String("file", "-", `JSON lines to submit, one {"key":…,"payload":…,"id":…,"type":…} each ("-": stdin); give IDs so that running it again applies nothing twice`)
	forceBars := fs.Bool("progress", false, "draw a progress bar on stderr even when it is not a terminal")
	if err := c.parse(fs, args, errOut); err != nil {
		return err
	}
	if c.url == "" {
		return usagef("--nats (or NATS_URL, or --context) is required: start workers with `go run ./cmd/worker` first")
	}
	var in io.Reader = os.Stdin
	total := int64(0) // not known for stdin
	if *file != "-" {
		f, err := os.Open(*file)
		if err != nil {
			return err
		}
		defer f.Close()
		if total, err = countLines(f); err != nil {
			return fmt.Errorf("%s: %w", *file, err)
		}
		if _, err := f.Seek(0, io.SeekStart); err != nil {
			return err
		}
		in = f
	}
	cl, _, done, err := c.connect(ctx, 0)
	if err != nil {
		return err
	}
	defer done()

	bars := progress.New(errOut, *forceBars)
	bar := bars.Bar("jobs", total)
	lines := bars.Lines(errOut)
	var read, stored, refused int
	var pending []keylane.Request
	var pendingLines []int
	flush := func() error {
		if len(pending) == 0 {
			return nil
		}
		res, err := cl.SubmitMany(ctx, pending)
		if err != nil {
			// The chunk's jobs may be stored or not; their IDs tell.
			return fmt.Errorf("%w; the last %d lines (from line %d) may or may not be stored", err, len(pending), pendingLines[0])
		}
		for i, r := range res {
			if r.Err != nil {
				refused++
				fmt.Fprintf(lines, "line %d (job %s): %v\n", pendingLines[i], r.ID, r.Err)
			} else {
				stored++
			}
		}
		bar.Add(len(pending))
		pending, pendingLines = pending[:0], pendingLines[:0]
		return nil
	}
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 64<<10), maxLine)
	n := 0
	for err == nil && ctx.Err() == nil && sc.Scan() {
		n++
		text := bytes.TrimSpace(sc.Bytes())
		if len(text) == 0 {
			continue
		}
		read++
		if total == 0 {
			bar.Grow(1)
		}
		r, lerr := parseLine(text)
		if lerr != nil {
			refused++
			bar.Add(1)
			fmt.Fprintf(lines, "line %d: %v\n", n, lerr)
			continue
		}
		pending = append(pending, r)
		pendingLines = append(pendingLines, n)
		if len(pending) == bulkChunk {
			err = flush()
		}
	}
	if err == nil {
		if err = sc.Err(); err != nil {
			err = fmt.Errorf("line %d: %w", n+1, err)
		}
	}
	if err == nil {
		err = flush()
	}
	if err == nil {
		bar.SetTotal(int64(read))
	}
	bars.Wait()
	fmt.Fprintf(out, "stored %d of %d jobs read; %d refused\n", stored, read, refused)
	if err != nil {
		return fmt.Errorf("bulk stopped after storing %d jobs: %w", stored, err)
	}
	if refused > 0 {
		return fmt.Errorf("%d of %d lines refused, nothing stored for them", refused, read)
	}
	return nil
}

// parseLine reads one job of bulk's input.
func parseLine(text []byte) (keylane.Request, error) {
	dec := json.NewDecoder(bytes.NewReader(text))
	dec.DisallowUnknownFields()
	var l bulkLine
	if err := dec.Decode(&l); err != nil {
		return keylane.Request{}, fmt.Errorf("not a job: %w", err)
	}
	if dec.More() {
		return keylane.Request{}, errors.New("not a job: more than one JSON value on the line")
	}
	if l.Key == "" {
		return keylane.Request{}, errors.New(`no "key"`)
	}
	payload := []byte(l.Payload)
	switch {
	case string(l.Payload) == "null":
		payload = nil
	case len(l.Payload) > 0 && l.Payload[0] == '"':
		var s string
		if err := json.Unmarshal(l.Payload, &s); err != nil {
			return keylane.Request{}, fmt.Errorf("payload: %w", err)
		}
		payload = []byte(s)
	}
	return keylane.Request{Key: l.Key, Payload: payload, ID: l.ID, Type: l.Type}, nil
}

// countLines counts the non-blank lines of r, the bar's total.
func countLines(r io.Reader) (int64, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), maxLine)
	var n int64
	for sc.Scan() {
		if len(bytes.TrimSpace(sc.Bytes())) > 0 {
			n++
		}
	}
	return n, sc.Err()
}
