package buildinfo

import "testing"

func TestString(t *testing.T) {
	for _, c := range []struct {
		in   Info
		want string
	}{
		{Info{Version: "v1.2.0"}, "v1.2.0"},
		{Info{Version: "(devel)", Revision: "0123456789abcdef"}, "(devel) (0123456789ab)"},
		{Info{Version: "(devel)", Revision: "0123", Modified: true}, "(devel) (0123, modified)"},
	} {
		if got := c.in.String(); got != c.want {
			t.Errorf("%+v: %q, want %q", c.in, got, c.want)
		}
	}
}

func TestLinkerVersionWins(t *testing.T) {
	defer func(v string) { version = v }(version)
	version = "v9.9.9"
	if in := Read(); in.Version != "v9.9.9" || in.Go == "" {
		t.Fatalf("Read with a linker version: %+v", in)
	}
	version = ""
	if in := Read(); in.Version == "v9.9.9" || in.Version == "" {
		t.Fatalf("Read without a linker version: %q; want the module's version or (unknown)", in.Version)
	}
}
