package wire

import (
	"bytes"
	"errors"
	"reflect"
	"strings"
	"testing"
)

func TestBatchOutcomesRoundTrip(t *testing.T) {
	outs := []BatchOutcome{
		{Index: 0, ID: BatchedJobID("B1aaaaaaaaaaaaaaaaaaaa", 0), Value: []byte("\x00ok")},
		{Index: 2, ID: BatchedJobID("B1aaaaaaaaaaaaaaaaaaaa", 2), Value: []byte("\x03dead")},
		{Index: 1023, ID: BatchedJobID("B1aaaaaaaaaaaaaaaaaaaa", 1023), Value: []byte{0}},
	}
	b, err := EncodeBatchOutcomes("B1aaaaaaaaaaaaaaaaaaaa", outs)
	if err != nil {
		t.Fatal(err)
	}
	id, got, err := DecodeBatchOutcomes(b)
	if err != nil || id != "B1aaaaaaaaaaaaaaaaaaaa" || !reflect.DeepEqual(got, outs) {
		t.Fatalf("decoded %q %v %v, want B1aaaaaaaaaaaaaaaaaaaa %v", id, got, err, outs)
	}
	v, err := FindBatchOutcome(b, "B1aaaaaaaaaaaaaaaaaaaa", 2, "B1aaaaaaaaaaaaaaaaaaaa.2")
	if err != nil || !bytes.Equal(v, []byte("\x03dead")) {
		t.Fatalf("find: %q %v", v, err)
	}
}

func TestBatchOutcomesRefusals(t *testing.T) {
	good, _ := EncodeBatchOutcomes("B1aaaaaaaaaaaaaaaaaaaa", []BatchOutcome{{Index: 1, ID: "B1aaaaaaaaaaaaaaaaaaaa.1", Value: []byte{0}}})
	for name, find := range map[string]func() error{
		"another batch's entry": func() error {
			_, err := FindBatchOutcome(good, "B2aaaaaaaaaaaaaaaaaaaa", 1, "B2aaaaaaaaaaaaaaaaaaaa.1")
			return err
		},
		"another job's ID": func() error { _, err := FindBatchOutcome(good, "B1aaaaaaaaaaaaaaaaaaaa", 1, "X.1"); return err },
		"garbled": func() error {
			_, err := FindBatchOutcome(append(good, 0), "B1aaaaaaaaaaaaaaaaaaaa", 1, "B1aaaaaaaaaaaaaaaaaaaa.1")
			return err
		},
		"cut": func() error {
			_, err := FindBatchOutcome(good[:len(good)-1], "B1aaaaaaaaaaaaaaaaaaaa", 1, "B1aaaaaaaaaaaaaaaaaaaa.1")
			return err
		},
		"version": func() error {
			b := bytes.Clone(good)
			b[3] = 9
			_, err := FindBatchOutcome(b, "B1aaaaaaaaaaaaaaaaaaaa", 1, "B1aaaaaaaaaaaaaaaaaaaa.1")
			return err
		},
		"ID not the batch's": func() error {
			_, err := EncodeBatchOutcomes("B1aaaaaaaaaaaaaaaaaaaa", []BatchOutcome{{Index: 1, ID: "B1aaaaaaaaaaaaaaaaaaaa.2", Value: []byte{0}}})
			return err
		},
		"indexes out of order": func() error {
			_, err := EncodeBatchOutcomes("B1aaaaaaaaaaaaaaaaaaaa", []BatchOutcome{{Index: 1, ID: "B1aaaaaaaaaaaaaaaaaaaa.1", Value: []byte{0}}, {Index: 1, ID: "B1aaaaaaaaaaaaaaaaaaaa.1", Value: []byte{0}}})
			return err
		},
		"empty outcome": func() error {
			_, err := EncodeBatchOutcomes("B1aaaaaaaaaaaaaaaaaaaa", []BatchOutcome{{Index: 1, ID: "B1aaaaaaaaaaaaaaaaaaaa.1"}})
			return err
		},
		"no outcomes": func() error { _, err := EncodeBatchOutcomes("B1aaaaaaaaaaaaaaaaaaaa", nil); return err },
	} {
		if err := find(); !errors.Is(err, ErrBadOutcomes) || errors.Is(err, ErrNoBatchOutcome) {
			t.Errorf("%s: %v, want ErrBadOutcomes", name, err)
		}
	}
}

// TestBatchOutcomesNoneAtIndex: the entry of the batch asked for, well
// formed, without an outcome at the index asked for is ErrNoBatchOutcome
// (legit: a job of the batch that keeps none in it), not ErrBadOutcomes
// (never legit). Before, both were ErrBadOutcomes, and a worker could not
// tell a garbled entry from one that lacks the job.
func TestBatchOutcomesNoneAtIndex(t *testing.T) {
	good, _ := EncodeBatchOutcomes("B1aaaaaaaaaaaaaaaaaaaa", []BatchOutcome{{Index: 1, ID: "B1aaaaaaaaaaaaaaaaaaaa.1", Value: []byte{0}}})
	for _, index := range []int{0, 2, MaxBatchJobs - 1} {
		_, err := FindBatchOutcome(good, "B1aaaaaaaaaaaaaaaaaaaa", index, BatchedJobID("B1aaaaaaaaaaaaaaaaaaaa", index))
		if !errors.Is(err, ErrNoBatchOutcome) || errors.Is(err, ErrBadOutcomes) {
			t.Errorf("index %d: %v, want ErrNoBatchOutcome only", index, err)
		}
	}
}

func TestParseBatchedJobID(t *testing.T) {
	for id, want := range map[string]bool{"B1aaaaaaaaaaaaaaaaaaaa.0": true, "B1aaaaaaaaaaaaaaaaaaaa.1023": true, "a.b.7": false,
		"B1aaaaaaaaaaaaaaaaaaaa": false, "B1aaaaaaaaaaaaaaaaaaaa.": false, ".1": false, "B1aaaaaaaaaaaaaaaaaaaa.01": false, "B1aaaaaaaaaaaaaaaaaaaa.1024": false, "B1aaaaaaaaaaaaaaaaaaaa.-1": false, "B1aaaaaaaaaaaaaaaaaaaa.+1": false, "B 1.1": false} {
		b, i, ok := ParseBatchedJobID(id)
		if ok != want || ok && BatchedJobID(b, i) != id {
			t.Errorf("ParseBatchedJobID(%q) = %q %d %v", id, b, i, ok)
		}
	}
}

// FuzzDecodeBatchOutcomes: whatever the bytes, the decoder returns an
// entry that encodes back to the same bytes, or ErrBadOutcomes; never a
// panic. An index a decoded entry does not hold is ErrNoBatchOutcome.
func FuzzDecodeBatchOutcomes(f *testing.F) {
	good, _ := EncodeBatchOutcomes("B1aaaaaaaaaaaaaaaaaaaa", []BatchOutcome{{Index: 0, ID: "B1aaaaaaaaaaaaaaaaaaaa.0", Value: []byte("\x00r")}, {Index: 300, ID: "B1aaaaaaaaaaaaaaaaaaaa.300", Value: []byte("\x01e")}})
	f.Add(good)
	f.Add([]byte("KLO\x01"))
	id := "B1" + strings.Repeat("a", 20)
	f.Add([]byte("KLO\x01\x16" + id + "\x01\x80\x01\x1a" + id + ".128\x01\x00"))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		id, outs, err := DecodeBatchOutcomes(b)
		if err != nil {
			if !errors.Is(err, ErrBadOutcomes) {
				t.Fatalf("error %v is not ErrBadOutcomes", err)
			}
			return
		}
		again, err := EncodeBatchOutcomes(id, outs)
		if err != nil || !bytes.Equal(again, b) {
			t.Fatalf("decoded entry re-encodes to %q, %v; read %q", again, err, b)
		}
		held := map[int]bool{}
		for _, o := range outs {
			held[o.Index] = true
			if v, err := FindBatchOutcome(b, id, o.Index, o.ID); err != nil || !bytes.Equal(v, o.Value) {
				t.Fatalf("find %d: %q %v", o.Index, v, err)
			}
		}
		for _, index := range []int{0, 1, 300, MaxBatchJobs - 1} {
			if held[index] {
				continue
			}
			if _, err := FindBatchOutcome(b, id, index, BatchedJobID(id, index)); !errors.Is(err, ErrNoBatchOutcome) || errors.Is(err, ErrBadOutcomes) {
				t.Fatalf("find %d, not held: %v, want ErrNoBatchOutcome", index, err)
			}
		}
	})
}
