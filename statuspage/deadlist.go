package statuspage

import (
	"context"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/keylane/keylane"
	"github.com/nats-io/nats.go/jetstream"
)

// DeadQuery selects the dead letters a page lists: newest first, those
// below sequence Before (0: from the newest on), of the keys containing
// Key, whose error contains Error (either case), dead-lettered at least
// Older and at most Newer ago (0: any). The page takes it as
// ?before=SEQ&dkey=KEY&derr=TEXT&older=DURATION&newer=DURATION.
type DeadQuery struct {
	Before uint64        `json:",omitempty"`
	Key    string        `json:",omitempty"`
	Error  string        `json:",omitempty"`
	Older  time.Duration `json:",omitempty"`
	Newer  time.Duration `json:",omitempty"`
}

// zero reports whether q is the default listing: the newest, unfiltered.
func (q DeadQuery) zero() bool { return q == DeadQuery{} }

// parseDeadQuery reads a DeadQuery from a request's query; a bad value is
// an error naming it.
func parseDeadQuery(v url.Values) (DeadQuery, error) {
	q := DeadQuery{Key: v.Get("dkey"), Error: v.Get("derr")}
	var errs []string
	if s := v.Get("before"); s != "" {
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil || n == 0 {
			errs = append(errs, fmt.Sprintf("before=%q is not a dead-letter sequence (a whole number from 1)", s))
		}
		q.Before = n
	}
	for _, f := range []struct {
		name string
		d    *time.Duration
	}{{"older", &q.Older}, {"newer", &q.Newer}} {
		s := v.Get(f.name)
		if s == "" {
			continue
		}
		d, err := time.ParseDuration(s)
		if err != nil || d < 0 {
			errs = append(errs, fmt.Sprintf("%s=%q is not an age: give a duration such as 90s, 15m or 2h", f.name, s))
		}
		*f.d = d
	}
	if q.Older != 0 && q.Newer != 0 && q.Older >= q.Newer {
		errs = append(errs, fmt.Sprintf("older than %s and newer than %s selects nothing", q.Older, q.Newer))
	}
	if len(errs) > 0 {
		return DeadQuery{}, fmt.Errorf("statuspage: %s", strings.Join(errs, "; "))
	}
	return q, nil
}

// values is q as the page's query.
func (q DeadQuery) values() url.Values {
	v := url.Values{}
	if q.Before != 0 {
		v.Set("before", strconv.FormatUint(q.Before, 10))
	}
	if q.Key != "" {
		v.Set("dkey", q.Key)
	}
	if q.Error != "" {
		v.Set("derr", q.Error)
	}
	if q.Older != 0 {
		v.Set("older", q.Older.String())
	}
	if q.Newer != 0 {
		v.Set("newer", q.Newer.String())
	}
	return v
}

func (q DeadQuery) match(d keylane.DeadLetter, now time.Time) bool {
	switch {
	case q.Key != "" && !strings.Contains(d.Key, q.Key):
		return false
	case q.Error != "" && !strings.Contains(strings.ToLower(d.Error), strings.ToLower(q.Error)):
		return false
	case q.Older != 0 && now.Sub(d.Time) < q.Older:
		return false
	case q.Newer != 0 && now.Sub(d.Time) > q.Newer:
		return false
	}
	return true
}

// DeadList is one page of dead letters, newest first.
type DeadList struct {
	Query DeadQuery `json:",omitempty"`
	// Older is the Before of the next page (the older letters); 0 when
	// there are none.
	Older uint64 `json:",omitempty"`
	// Scanned counts the dead letters read to fill the page; Cut says the
	// scan stopped at its bound (deadScan) before the page was full: the
	// next page (Older) goes on from where it stopped.
	Scanned int  `json:",omitempty"`
	Cut     bool `json:",omitempty"`
	// First and Last are the stream's first and last sequences.
	First, Last uint64 `json:",omitempty"`
}

const (
	// deadScan bounds the dead letters one page reads (one request each)
	// to fill itself when filtered.
	deadScan = 1000
	// deadWindow is how many sequences one read of the stream covers.
	deadWindow = 50
)

// listDead reads a page of at most limit dead letters of namespace that q
// selects, newest first, reading the stream backwards from q.Before; their
// Payload is left out.
func listDead(ctx context.Context, js jetstream.JetStream, namespace string, q DeadQuery, limit int, now time.Time) (l DeadList, letters []keylane.DeadLetter, err error) {
	l.Query = q
	n, first, last, err := keylane.DeadLetterSpan(ctx, js, namespace)
	if err != nil || n == 0 {
		return l, nil, err
	}
	l.First, l.Last = first, last
	top := last
	if q.Before != 0 {
		if q.Before <= first {
			return l, nil, nil
		}
		top = min(top, q.Before-1)
	}
	for top >= first {
		lo := first
		if top-first >= deadWindow {
			lo = top - deadWindow + 1
		}
		ds, err := keylane.DeadLetters(ctx, js, namespace, lo, int(top-lo+1))
		if err != nil {
			return l, letters, err
		}
		for i := len(ds) - 1; i >= 0; i-- {
			d := ds[i]
			if d.Seq > top {
				continue
			}
			l.Scanned++
			if q.Newer != 0 && now.Sub(d.Time) > q.Newer {
				return l, letters, nil // the stream's clock only grows: the rest are older
			}
			if !q.match(d, now) {
				continue
			}
			if len(letters) == limit {
				l.Older = letters[limit-1].Seq
				return l, letters, nil
			}
			d.Payload = nil
			letters = append(letters, d)
		}
		if lo == first {
			return l, letters, nil
		}
		top = lo - 1
		if l.Scanned >= deadScan {
			l.Cut, l.Older = true, lo
			return l, letters, nil
		}
	}
	return l, letters, nil
}
