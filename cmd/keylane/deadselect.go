package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"strings"
	"time"

	"github.com/keylane/keylane"
	"github.com/nats-io/nats.go/jetstream"
)

// deadSelection is what a dead-letter command's filters select: every
// condition given must hold. Its zero value selects every dead letter.
type deadSelection struct {
	key, errText, job    string
	olderThan, newerThan time.Duration
	from, before         uint64 // sequences from, and below before (0: no bound)
	now                  time.Time
}

// register adds the selection's flags to fs.
func (s *deadSelection) register(fs *flag.FlagSet, listing bool) {
	fs.StringVar(&s.key, "key", "", "only the dead letters of this key")
	fs.StringVar(&s.errText, "error", "", "only those whose error holds this text (any case)")
	fs.StringVar(&s.job, "job", "", "only those of this job ID (a batch dead-lettered whole: its batch's ID)")
	fs.DurationVar(&s.olderThan, "older-than", 0, "only those dead-lettered longer ago than this, e.g. 1h")
	fs.DurationVar(&s.newerThan, "newer-than", 0, "only those dead-lettered within this, e.g. 15m")
	fs.Uint64Var(&s.from, "from", 0, "only sequences from this one on")
	help := "only sequences below this one"
	if listing {
		help += " (the next page: the --before a listing ends with)"
	}
	fs.Uint64Var(&s.before, "before", 0, help)
}

// filterFlags are the flags register adds: any of them given is a
// selection.
var filterFlags = []string{"key", "error", "job", "older-than", "newer-than", "from", "before"}

// check refuses values that select nothing by mistake.
func (s *deadSelection) check(cmd string, set map[string]bool) error {
	switch {
	case set["older-than"] && s.olderThan <= 0, set["newer-than"] && s.newerThan <= 0:
		return usagef("dead %s: --older-than and --newer-than take a positive duration, e.g. 1h", cmd)
	case set["before"] && s.before <= 1:
		return usagef("dead %s: --before %d: want a sequence above 1", cmd, s.before)
	case set["key"] && s.key == "", set["error"] && s.errText == "", set["job"] && s.job == "":
		return usagef("dead %s: --key, --error and --job take a non-empty value", cmd)
	}
	return nil
}

func (s *deadSelection) match(d keylane.DeadLetter) bool {
	switch {
	case s.key != "" && d.Key != s.key,
		s.job != "" && d.JobID != s.job,
		s.errText != "" && !strings.Contains(strings.ToLower(d.Error), strings.ToLower(s.errText)),
		s.olderThan > 0 && !d.Time.Before(s.now.Add(-s.olderThan)),
		s.newerThan > 0 && !d.Time.After(s.now.Add(-s.newerThan)):
		return false
	}
	return true
}

// span is the sequences the selection may hold in a stream whose dead
// letters run from first to last: lo to hi, empty when lo > hi.
func (s *deadSelection) span(first, last uint64) (lo, hi uint64) {
	lo, hi = max(first, s.from, 1), last
	if s.before > 0 {
		hi = min(hi, s.before-1)
	}
	return lo, hi
}

// scan reads the dead letters the selection holds, newest first (or
// oldest first), up to limit, and returns them with whether more may
// follow. Sequences deleted one by one are skipped. An age bound ends the
// scan where the stream's time order says no more can match.
func (s *deadSelection) scan(ctx context.Context, js jetstream.JetStream, namespace string, newestFirst bool, limit int) ([]keylane.DeadLetter, bool, error) {
	n, first, last, err := keylane.DeadLetterSpan(ctx, js, namespace)
	if err != nil || n == 0 {
		return nil, false, err
	}
	lo, hi := s.span(first, last)
	if lo > hi {
		return nil, false, nil
	}
	var out []keylane.DeadLetter
	seq, step, end := lo, uint64(1), hi
	if newestFirst {
		seq, step, end = hi, ^uint64(0), lo // step -1
	}
	for {
		if len(out) == limit {
			return out, true, nil
		}
		d, err := keylane.DeadLetterAt(ctx, js, namespace, seq)
		switch {
		case errors.Is(err, jetstream.ErrMsgNotFound):
		case err != nil:
			return nil, false, fmt.Errorf("dead letter %d: %w", seq, err)
		case newestFirst && s.newerThan > 0 && !d.Time.After(s.now.Add(-s.newerThan)),
			!newestFirst && s.olderThan > 0 && !d.Time.Before(s.now.Add(-s.olderThan)):
			return out, false, nil // the rest are older (newer) still
		case s.match(d):
			out = append(out, d)
		}
		if seq == end {
			return out, false, nil
		}
		seq += step
	}
}

// errNoDeadLetter is a sequence or job that holds no dead letter: the
// read worked and its answer is "none" (exit 3).
type errNoDeadLetter struct{ what string }

func (e errNoDeadLetter) Error() string { return "no dead letter " + e.what }

// deadAt reads the dead letter at seq; one that is not there (never, or
// redriven or purged) is errNoDeadLetter, not the server's code.
func deadAt(ctx context.Context, js jetstream.JetStream, namespace string, seq uint64) (keylane.DeadLetter, error) {
	d, err := keylane.DeadLetterAt(ctx, js, namespace, seq)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return d, errNoDeadLetter{fmt.Sprintf("at sequence %d in namespace %s (never one, or redriven, purged or expired after 7 days)", seq, namespace)}
	}
	if err != nil {
		return d, fmt.Errorf("dead letter %d: %w", seq, err)
	}
	return d, nil
}
