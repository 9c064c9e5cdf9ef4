package compat_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ichor-dev/kubectl-ichor/pkg/compat"
)

var v = compat.MustParseVersion

// TestTables pins what this build reads from machinery v1.14.1's tables (DESIGN.md's
// Versions): a change of machinery that moves them shows here first.
func TestTables(t *testing.T) {
	for talos, want := range map[string]string{"v1.14.1": "1.32-1.37", "v1.13.9": "1.31-1.36", "v1.12.0": "1.30-1.35"} {
		r, err := compat.KubernetesRange(v(talos))
		require.NoError(t, err)
		assert.Equal(t, want, r.String(), talos)
	}

	assert.Equal(t, "1.14", compat.NewestTalos().MinorString())
	assert.Equal(t, "1.2", compat.TalosMinors()[0].MinorString())

	build, ok := compat.BuildTalos()
	require.True(t, ok)
	assert.Equal(t, "v1.14.1", build.String())

	assert.True(t, compat.SSAManifestSync(v("v1.13.0")))
	assert.False(t, compat.SSAManifestSync(v("v1.12.6")))

	m, ok := compat.TalosFor(v("v1.37.2"), v("v1.12.3"))
	require.True(t, ok)
	assert.Equal(t, "1.14", m.MinorString())

	_, ok = compat.TalosFor(v("v1.38.0"), v("v1.12.3"))
	assert.False(t, ok)
}

func TestSupports(t *testing.T) {
	tests := []struct {
		talos, kubernetes string
		wantErr           string
	}{
		{talos: "v1.14.1", kubernetes: "v1.37.2"},
		{talos: "v1.14.1", kubernetes: "v1.32.0"},
		{talos: "v1.14.1", kubernetes: "v1.31.9", wantErr: "Talos v1.14.1 supports Kubernetes 1.32-1.37, not v1.31.9"},
		{talos: "v1.13.9", kubernetes: "v1.37.0", wantErr: "Talos v1.13.9 supports Kubernetes 1.31-1.36, not v1.37.0"},
		// machinery's bound is 1.37.99, exclusive: within the range's minors, machinery's own words.
		{talos: "v1.14.1", kubernetes: "v1.37.99", wantErr: "version of Kubernetes 1.37.99 is too new to be used with Talos 1.14.1"},
		{talos: "v1.15.0", kubernetes: "v1.37.0", wantErr: "Talos 1.15 is newer than this build knows (Talos up to 1.14)"},
	}

	for _, tt := range tests {
		t.Run(tt.talos+" "+tt.kubernetes, func(t *testing.T) {
			err := compat.Supports(v(tt.talos), v(tt.kubernetes))
			if tt.wantErr == "" {
				assert.NoError(t, err)

				return
			}

			assert.EqualError(t, err, tt.wantErr)
		})
	}
}

func TestUpgradeable(t *testing.T) {
	tests := []struct {
		from, to string
		wantErr  string
	}{
		{from: "v1.12.0", to: "v1.14.1"},
		{from: "v1.13.9", to: "v1.14.1"},
		{from: "v1.14.1", to: "v1.14.1"},
		{from: "v1.11.6", to: "v1.13.5"},
		{from: "v1.11.6", to: "v1.14.1", wantErr: "host version 1.11.6 is too old to upgrade to Talos 1.14.1"},
		{from: "v1.14.1", to: "v1.14.0", wantErr: "v1.14.0 is older than the running v1.14.1: downgrades are not supported"},
		{from: "v1.14.1", to: "v1.15.0", wantErr: "Talos 1.15 is newer than this build knows (Talos up to 1.14)"},
	}

	for _, tt := range tests {
		t.Run(tt.from+" to "+tt.to, func(t *testing.T) {
			err := compat.Upgradeable(v(tt.from), v(tt.to))
			if tt.wantErr == "" {
				assert.NoError(t, err)

				return
			}

			assert.EqualError(t, err, tt.wantErr)

			if tt.to == "v1.15.0" {
				var unknown *compat.UnknownTalosError
				require.ErrorAs(t, err, &unknown)
				assert.Contains(t, unknown.Action(), "upgrade kubectl-ichor")
			}
		})
	}
}

func TestParseVersion(t *testing.T) {
	tests := []struct {
		in      string
		want    compat.Version
		wantErr bool
	}{
		{in: "v1.36.3", want: compat.Version{Major: 1, Minor: 36, Patch: 3}},
		{in: "v1.0.0", want: compat.Version{Major: 1}},
		{in: "1.36.3", wantErr: true},
		{in: "v1.36", wantErr: true},
		{in: "v1.36.3-rc.0", wantErr: true},
		{in: "v1.13.0-beta.1", wantErr: true},
		{in: "v1.036.3", wantErr: true},
		{in: "v1.36.3 ", wantErr: true},
		{in: "v1.36.3@sha256:0123", wantErr: true},
		{in: "", wantErr: true},
	}

	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := compat.ParseVersion(tt.in)
			if tt.wantErr {
				require.Error(t, err)
				assert.Contains(t, err.Error(), "vMAJOR.MINOR.PATCH")

				return
			}

			require.NoError(t, err)
			assert.Equal(t, tt.want, got)
			assert.Equal(t, tt.in, got.String())
		})
	}
}

func TestStep(t *testing.T) {
	tests := []struct {
		name     string
		from, to string
		wantErr  string
	}{
		{name: "patch", from: "v1.35.4", to: "v1.35.6"},
		{name: "same", from: "v1.35.4", to: "v1.35.4"},
		{name: "one minor", from: "v1.35.4", to: "v1.36.3"},
		{name: "downgrade", from: "v1.36.3", to: "v1.36.1", wantErr: "downgrades are not supported"},
		{name: "minor downgrade", from: "v1.36.3", to: "v1.35.9", wantErr: "downgrades are not supported"},
		{name: "skipped minor", from: "v1.34.2", to: "v1.36.3", wantErr: "upgrade to 1.35 first"},
		{name: "major", from: "v1.36.3", to: "v2.0.0", wantErr: "major"},
	}

	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := compat.Step(v(tt.from), v(tt.to))
			if tt.wantErr == "" {
				assert.NoError(t, err)

				return
			}

			require.Error(t, err)
			assert.Contains(t, err.Error(), tt.wantErr)
		})
	}
}
