// Package buildinfo says which keylane is running: the one place the
// commands' --version, the worker's lease entries (the console's worker
// list) and the keylane_build_info metric read it from.
package buildinfo

import (
	"runtime"
	"runtime/debug"
)

// version is the release a build names, set by the linker:
//
//	go build -ldflags "-X github.com/keylane/keylane/internal/buildinfo.version=v1.2.0" ./cmd/keylane
//
// Empty, Read takes the keylane module's version the go command recorded
// in the binary.
var version string

// ModulePath is keylane's module, whose version Read reports.
const ModulePath = "github.com/keylane/keylane"

// Info is the running binary's keylane.
type Info struct {
	// Version is the linker's version if one was set, else the keylane
	// module's version in the binary: the main module's ("(devel)" in a
	// checkout, v1.2.0 after go install …@v1.2.0) or, in a program that
	// imports keylane, the dependency's. "(unknown)" without build
	// information.
	Version string
	// Revision is the VCS revision the binary was built from, "" when the
	// go command recorded none (only a build of keylane's own module
	// records one).
	Revision string
	// Modified reports a build from a tree with uncommitted changes.
	Modified bool
	// Go is the Go release that built the binary.
	Go string
}

// Read returns the running binary's Info.
func Read() Info {
	in := Info{Version: version, Go: runtime.Version()}
	bi, ok := debug.ReadBuildInfo()
	if ok && in.Version == "" {
		if bi.Main.Path == ModulePath {
			in.Version = bi.Main.Version
		}
		for _, d := range bi.Deps {
			if d.Path == ModulePath && d.Version != "" {
				in.Version = d.Version
			}
		}
	}
	if in.Version == "" {
		in.Version = "(unknown)"
	}
	if !ok || bi.Main.Path != ModulePath {
		return in
	}
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			in.Revision = s.Value
		case "vcs.modified":
			in.Modified = s.Value == "true"
		}
	}
	return in
}

// String is the version and, when known, the short revision:
// "v1.2.0", "(devel) (0123456789ab, modified)".
func (in Info) String() string {
	if in.Revision == "" {
		return in.Version
	}
	rev := in.Revision[:min(12, len(in.Revision))]
	if in.Modified {
		rev += ", modified"
	}
	return in.Version + " (" + rev + ")"
}
