package plugin

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestProfileFlag(t *testing.T) {
	for _, name := range []string{"cpu", "heap", "allocs", "trace"} {
		t.Run(name, func(t *testing.T) {
			out := filepath.Join(t.TempDir(), name+".pprof")

			stdout, stderr, code := runWith(t, fakeDeps(fixture(), nil), "plan", "kubernetes", "--to", "v1.36.3", "-o", "json",
				"--profile", name, "--profile-output", out)
			require.Equal(t, ExitOK, code, stderr)
			assert.NotEmpty(t, stdout)

			b, err := os.ReadFile(out)
			require.NoError(t, err)
			require.Greater(t, len(b), 2)

			if name == "trace" {
				assert.True(t, bytes.HasPrefix(b, []byte("go 1.")), "an execution trace starts with its Go version: %q", b[:8])
			} else {
				assert.Equal(t, []byte{0x1f, 0x8b}, b[:2], "pprof writes a gzipped profile")
			}
		})
	}
}

func TestProfileFlagRefusesAnUnknownProfile(t *testing.T) {
	out := filepath.Join(t.TempDir(), "p.pprof")

	_, stderr, code := runWith(t, fakeDeps(fixture(), nil), "plan", "kubernetes", "--to", "v1.36.3", "--profile", "block", "--profile-output", out)
	assert.Equal(t, ExitError, code)
	assert.Equal(t, "error: --profile \"block\": pass none, cpu, heap, allocs or trace\n", stderr)
	assert.NoFileExists(t, out)
}
