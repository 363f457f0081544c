package wire

import (
	"bytes"
	"errors"
	"reflect"
	"testing"
)

func TestBatchOutcomesRoundTrip(t *testing.T) {
	outs := []BatchOutcome{
		{Index: 0, ID: BatchedJobID("B1", 0), Value: []byte("\x00ok")},
		{Index: 2, ID: BatchedJobID("B1", 2), Value: []byte("\x03dead")},
		{Index: 1023, ID: BatchedJobID("B1", 1023), Value: []byte{0}},
	}
	b, err := EncodeBatchOutcomes("B1", outs)
	if err != nil {
		t.Fatal(err)
	}
	id, got, err := DecodeBatchOutcomes(b)
	if err != nil || id != "B1" || !reflect.DeepEqual(got, outs) {
		t.Fatalf("decoded %q %v %v, want B1 %v", id, got, err, outs)
	}
	v, err := FindBatchOutcome(b, "B1", 2, "B1.2")
	if err != nil || !bytes.Equal(v, []byte("\x03dead")) {
		t.Fatalf("find: %q %v", v, err)
	}
}

func TestBatchOutcomesRefusals(t *testing.T) {
	good, _ := EncodeBatchOutcomes("B1", []BatchOutcome{{Index: 1, ID: "B1.1", Value: []byte{0}}})
	for name, find := range map[string]func() error{
		"another batch's entry": func() error { _, err := FindBatchOutcome(good, "B2", 1, "B2.1"); return err },
		"another job's ID":      func() error { _, err := FindBatchOutcome(good, "B1", 1, "X.1"); return err },
		"no outcome at index":   func() error { _, err := FindBatchOutcome(good, "B1", 0, "B1.0"); return err },
		"garbled":               func() error { _, err := FindBatchOutcome(append(good, 0), "B1", 1, "B1.1"); return err },
		"cut":                   func() error { _, err := FindBatchOutcome(good[:len(good)-1], "B1", 1, "B1.1"); return err },
		"version": func() error {
			b := bytes.Clone(good)
			b[3] = 9
			_, err := FindBatchOutcome(b, "B1", 1, "B1.1")
			return err
		},
		"ID not the batch's": func() error {
			_, err := EncodeBatchOutcomes("B1", []BatchOutcome{{Index: 1, ID: "B1.2", Value: []byte{0}}})
			return err
		},
		"indexes out of order": func() error {
			_, err := EncodeBatchOutcomes("B1", []BatchOutcome{{Index: 1, ID: "B1.1", Value: []byte{0}}, {Index: 1, ID: "B1.1", Value: []byte{0}}})
			return err
		},
		"empty outcome": func() error {
			_, err := EncodeBatchOutcomes("B1", []BatchOutcome{{Index: 1, ID: "B1.1"}})
			return err
		},
		"no outcomes": func() error { _, err := EncodeBatchOutcomes("B1", nil); return err },
	} {
		if err := find(); !errors.Is(err, ErrBadOutcomes) {
			t.Errorf("%s: %v, want ErrBadOutcomes", name, err)
		}
	}
}

func TestParseBatchedJobID(t *testing.T) {
	for id, want := range map[string]bool{"B1.0": true, "B1.1023": true, "a.b.7": true,
		"B1": false, "B1.": false, ".1": false, "B1.01": false, "B1.1024": false, "B1.-1": false, "B1.+1": false, "B 1.1": false} {
		b, i, ok := ParseBatchedJobID(id)
		if ok != want || ok && BatchedJobID(b, i) != id {
			t.Errorf("ParseBatchedJobID(%q) = %q %d %v", id, b, i, ok)
		}
	}
}

// FuzzDecodeBatchOutcomes: whatever the bytes, the decoder returns an
// entry that encodes back to the same bytes, or ErrBadOutcomes; never a
// panic.
func FuzzDecodeBatchOutcomes(f *testing.F) {
	good, _ := EncodeBatchOutcomes("B1", []BatchOutcome{{Index: 0, ID: "B1.0", Value: []byte("\x00r")}, {Index: 300, ID: "B1.300", Value: []byte("\x01e")}})
	f.Add(good)
	f.Add([]byte("KLO\x01"))
	f.Add([]byte("KLO\x01\x02B1\x01\x80\x01\x06B1.128\x01\x00"))
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
		for _, o := range outs {
			if v, err := FindBatchOutcome(b, id, o.Index, o.ID); err != nil || !bytes.Equal(v, o.Value) {
				t.Fatalf("find %d: %q %v", o.Index, v, err)
			}
		}
	})
}
