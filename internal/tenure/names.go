package tenure

import (
	"github.com/keylane/keylane/internal/core"
	"github.com/keylane/keylane/internal/namespace"
	"github.com/keylane/keylane/internal/natserr"
	"github.com/keylane/keylane/internal/statestore"
	"github.com/keylane/keylane/wire"
)

// The names the tenure's code calls the shared vocabulary by: package
// keylane's (internal/core's, wire's), so the code read the same when it
// moved here from the root.

type (
	// Job is a job as the handler sees it.
	Job         = core.Job
	RemoteError = core.RemoteError
	stateError  = core.StateError

	JobGroup                = core.JobGroup
	JobOutcome              = core.JobOutcome
	RecordReader            = core.RecordReader
	CommitObserver          = core.CommitObserver
	UncertainCommitObserver = core.UncertainCommitObserver
)

var (
	Permanent = core.Permanent

	ErrPermanent        = core.ErrPermanent
	ErrStaleFence       = core.ErrStaleFence
	ErrGap              = core.ErrGap
	ErrEpoch            = core.ErrEpoch
	ErrUnavailable      = core.ErrUnavailable
	ErrStateUnavailable = core.ErrStateUnavailable
)

const (
	requestTimeout      = core.RequestTimeout
	resultLookupTimeout = core.ResultLookupTimeout
	counterTimeout      = core.CounterTimeout
	resyncCalm          = core.ResyncCalm
	releaseHold         = core.ReleaseHold
)

// The headers a job's message carries (package wire's).
const (
	HeaderJobID       = wire.HeaderJobID
	HeaderKey         = wire.HeaderKey
	HeaderType        = wire.HeaderType
	HeaderReply       = wire.HeaderReply
	HeaderError       = wire.HeaderError
	HeaderErrorKind   = wire.HeaderErrorKind
	HeaderIdempotent  = wire.HeaderIdempotent
	HeaderKeepOutcome = wire.HeaderKeepOutcome
	HeaderRedriveOf   = wire.HeaderRedriveOf
)

// oneHeader is the value of flag headers.
var oneHeader = []string{"1"}

// ValidateJobID reports why id is no valid job ID, or nil.
var ValidateJobID = wire.ValidateJobID

// natsError drops the second "nats: " of a nats.go error (natserr.Once).
func natsError(err error) error { return natserr.Once(err) }

// Namespace and state helpers, their packages'.
var (
	readMeta  = namespace.ReadMeta
	apiPrefix = namespace.APIPrefix
	ShardOf   = namespace.ShardOf
	casPut    = statestore.Put
	casLoop   = statestore.Loop
)

// decodeResult reads an outcome: the result, or a *RemoteError; ok is
// false for one wire.DecodeOutcome refuses.
func decodeResult(b []byte) (_ []byte, _ error, ok bool) { return core.DecodeOutcome(b) }
