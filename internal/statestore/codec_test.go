package statestore

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math"
	"reflect"
	"strconv"
	"testing"

	"github.com/keylane/keylane/internal/core"
)

// saleEntry is a hot key's entry in a sale (internal/sale, inventory): a
// full window of outcomes whose IDs share the run's prefix, with results
// "sold N" while stock lasts and "soldout 0" after.
func saleEntry(held int, soldOut bool) Entry {
	e := Entry{Value: []byte("0"), Fence: 7, Epoch: 0x1234_5678_9abc_def0}
	for i := range held {
		r := AppliedResult{Seq: uint64(1000 + 3*i), ID: "Q2VBN8JQW3ZKTXHAJ1D4PA-" + strconv.Itoa(20000+i), Result: []byte("sold " + strconv.Itoa(2000-i))}
		if soldOut {
			r.Result = []byte("soldout 0")
		}
		e.Recent = append(e.Recent, r)
	}
	last := e.Recent[len(e.Recent)-1]
	e.Recent = e.Recent[:len(e.Recent)-1]
	e.Seq, e.JobID, e.Result = last.Seq, last.ID, last.Result
	return e
}

// encodeStateV3 is the version 3 encoder that workers before version 4
// wrote with; their entries must still be read.
func encodeStateV3(e Entry) []byte {
	b := []byte{stateV3}
	b = binary.BigEndian.AppendUint64(b, e.Fence)
	b = binary.BigEndian.AppendUint64(b, e.Epoch)
	b = binary.BigEndian.AppendUint16(b, uint16(len(e.Recent)+1))
	one := func(seq uint64, id string, res []byte) {
		b = binary.BigEndian.AppendUint64(b, seq)
		b = binary.BigEndian.AppendUint16(b, uint16(len(id)))
		b = append(b, id...)
		b = binary.BigEndian.AppendUint32(b, uint32(len(res)))
		b = append(b, res...)
	}
	for _, r := range e.Recent {
		one(r.Seq, r.ID, r.Result)
	}
	one(e.Seq, e.JobID, e.Result)
	return append(b, e.Value...)
}

// Every entry decodes to itself: outcomes out of sequence order (an adopted
// stream's), sequences at the ends of uint64, IDs sharing all, part or none
// of the previous one, empty, repeated and differing results, no value.
func TestStateCodecRoundTrip(t *testing.T) {
	entries := []Entry{
		{Seq: 1, JobID: "a"},
		{Seq: math.MaxUint64, Fence: math.MaxUint64, Epoch: math.MaxUint64, JobID: "x", Result: []byte("r"), Value: []byte("v")},
		{Seq: 5, Fence: 2, JobID: "job-10", Result: []byte("same"), Value: []byte("val"), Recent: []AppliedResult{
			{Seq: math.MaxUint64 - 1, ID: "job-1", Result: []byte("same")},
			{Seq: 0, ID: "job-1", Result: []byte("same")}, // the same ID twice: all shared
			{Seq: 900, ID: "job", Result: nil},            // a prefix of the previous
			{Seq: 3, ID: "other", Result: nil},            // nothing shared; an empty result reads as nil in every version
			{Seq: 4, ID: "job-9", Result: []byte("same")},
		}},
		saleEntry(HeldJobs, false),
		saleEntry(HeldJobs, true),
		// A job of a batch message applied last: version 5.
		{Seq: 7, Index: 3, Fence: 2, Epoch: 9, JobID: "b3", Result: []byte("r"), Value: []byte("v"), Recent: []AppliedResult{{Seq: 7, ID: "b1"}}},
		{Seq: 7, Index: 1023, JobID: "b"},
	}
	for i, e := range entries {
		got, err := Decode(encodeState(e))
		if err != nil {
			t.Fatalf("entry %d: %v", i, err)
		}
		if !reflect.DeepEqual(got, e) {
			t.Fatalf("entry %d decoded to\n%+v\nwant\n%+v", i, got, e)
		}
		// A result a caller gets must not alias another outcome's.
		if len(got.Recent) > 1 && got.Recent[0].Result != nil && got.Recent[1].Result != nil {
			got.Recent[0].Result[0] ^= 0xff
			if got.Recent[1].Result[0] == got.Recent[0].Result[0] {
				t.Fatalf("entry %d: held results share their bytes", i)
			}
		}
	}
}

// Entries written by earlier versions are still read.
func TestStateCodecReadsEarlierVersions(t *testing.T) {
	e := saleEntry(40, false)
	got, err := Decode(encodeStateV3(e))
	if err != nil || !reflect.DeepEqual(got, e) {
		t.Fatalf("version 3: %v, equal %v", err, reflect.DeepEqual(got, e))
	}
	// Version 1: seq, fence, job ID, result, value.
	v1 := []byte{stateV1}
	v1 = binary.BigEndian.AppendUint64(v1, 9)
	v1 = binary.BigEndian.AppendUint64(v1, 4)
	v1 = binary.BigEndian.AppendUint16(v1, 2)
	v1 = append(v1, "id"...)
	v1 = binary.BigEndian.AppendUint32(v1, 3)
	v1 = append(v1, "res"...)
	v1 = append(v1, "value"...)
	want := Entry{Seq: 9, Fence: 4, JobID: "id", Result: []byte("res"), Value: []byte("value")}
	if got, err := Decode(v1); err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("version 1 = %+v, %v; want %+v", got, err, want)
	}
	// Version 2 adds the earlier results of the same write, without IDs.
	v2 := bytes.Clone(v1[:len(v1)-len("value")])
	v2[0] = stateV2
	v2 = binary.BigEndian.AppendUint16(v2, 1)
	v2 = binary.BigEndian.AppendUint64(v2, 8)
	v2 = binary.BigEndian.AppendUint32(v2, 2)
	v2 = append(v2, "r8"...)
	v2 = append(v2, "value"...)
	want.Recent = []AppliedResult{{Seq: 8, Result: []byte("r8")}}
	if got, err := Decode(v2); err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("version 2 = %+v, %v; want %+v", got, err, want)
	}
}

// A cut or corrupted entry is core.ErrBadState, never a panic and never an
// entry with fewer outcomes than were written (a cut inside the outcomes
// must not read as a shorter window plus a value).
func TestStateCodecRefusesDamagedEntries(t *testing.T) {
	e := saleEntry(8, false)
	e.Value = nil
	b := encodeState(e)
	for n := range len(b) {
		if _, err := Decode(b[:n]); !errors.Is(err, core.ErrBadState) {
			t.Fatalf("entry cut to %d of %d bytes: %v, want core.ErrBadState", n, len(b), err)
		}
	}
	for _, bad := range [][]byte{
		{stateV4},
		{stateV4, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0}, // no outcome
		{stateV4, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0x0f}, // a count beyond the bytes
		{stateV4, 1, 0, 0, 0, 0, 0, 0, 0, 0, 1, 2, 1, 0, 'a', 1},           // shares more than the previous ID
		{stateV4, 1, 0, 0, 0, 0, 0, 0, 0, 0, 1, 2, 0, 1, 'a', 0},           // "same result" with no previous
		{stateV4, 1, 0, 0, 0, 0, 0, 0, 0, 0, 1, 2, 0, 1, 'a', 9, 'r'},      // result beyond the bytes
		{99, 0, 0, 0},
	} {
		if _, err := Decode(bad); !errors.Is(err, core.ErrBadState) {
			t.Fatalf("%v: %v, want core.ErrBadState", bad, err)
		}
	}
}

// A hot key's full window costs a fraction of version 3's bytes: every
// group commit of the key rewrites it. Fails if the compaction is lost.
func TestStateCodecCompactsAFullWindow(t *testing.T) {
	for _, soldOut := range []bool{false, true} {
		e := saleEntry(HeldJobs, soldOut)
		v3, v4 := len(encodeStateV3(e)), len(encodeState(e))
		t.Logf("a sale's hot key, %d held outcomes, sold out %v: version 3 %d bytes, version 4 %d bytes", HeldJobs, soldOut, v3, v4)
		if v4*2 > v3 {
			t.Fatalf("sold out %v: version 4 takes %d bytes, version 3 %d: want at most half", soldOut, v4, v3)
		}
	}
}

func BenchmarkStateCodec(b *testing.B) {
	e := saleEntry(HeldJobs, false)
	b.Run("encode", func(b *testing.B) {
		b.ReportAllocs()
		var n int
		for b.Loop() {
			n = len(encodeState(e))
		}
		b.ReportMetric(float64(n), "bytes/entry")
	})
	b.Run("decode", func(b *testing.B) {
		b.ReportAllocs()
		enc := encodeState(e)
		for b.Loop() {
			if _, err := Decode(enc); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// TestStateCodecWritesIndexOnlyWhenSet: an entry whose last job came in a
// one-job message is version 4 byte for byte (a worker of the previous
// release reads it); one of a batch's later job is version 5, and a
// version 5 entry with a damaged index is refused.
func TestStateCodecWritesIndexOnlyWhenSet(t *testing.T) {
	e := saleEntry(40, false)
	if b := encodeState(e); b[0] != stateV4 {
		t.Fatalf("an entry without an index is version %d", b[0])
	}
	e.Index = 2
	b := encodeState(e)
	if b[0] != stateV5 {
		t.Fatalf("an entry with an index is version %d", b[0])
	}
	if got, err := Decode(b); err != nil || got.Index != 2 {
		t.Fatalf("decoded %+v, %v", got.Index, err)
	}
	for _, bad := range [][]byte{
		{stateV5, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 1, 1, 1},       // index 0
		{stateV5, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0x80, 0x10, 1, 0, 1, 1}, // index 2048
		{stateV5, 1, 0, 0, 0, 0, 0, 0, 0, 0},                         // cut before the index
	} {
		if _, err := Decode(bad); !errors.Is(err, core.ErrBadState) {
			t.Errorf("Decode(%v) = %v, want core.ErrBadState", bad, err)
		}
	}
}
