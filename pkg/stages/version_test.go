package stages_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ichor-dev/kubectl-ichor/pkg/stages"
)

func TestParseVersion(t *testing.T) {
	tests := []struct {
		in      string
		want    stages.Version
		wantErr bool
	}{
		{in: "v1.36.3", want: stages.Version{Major: 1, Minor: 36, Patch: 3}},
		{in: "v1.0.0", want: stages.Version{Major: 1}},
		{in: "1.36.3", wantErr: true},
		{in: "v1.36", wantErr: true},
		{in: "v1.36.3-rc.0", wantErr: true},
		{in: "v1.036.3", wantErr: true},
		{in: "v1.36.3 ", wantErr: true},
		{in: "", wantErr: true},
	}

	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := stages.ParseVersion(tt.in)
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

func TestCheckStep(t *testing.T) {
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
			err := stages.CheckStep(stages.MustParseVersion(tt.from), stages.MustParseVersion(tt.to))
			if tt.wantErr == "" {
				assert.NoError(t, err)

				return
			}

			require.Error(t, err)
			assert.Contains(t, err.Error(), tt.wantErr)
		})
	}
}
