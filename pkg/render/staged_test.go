package render

import (
	"testing"

	"github.com/siderolabs/talos/pkg/machinery/config"
	"github.com/siderolabs/talos/pkg/machinery/config/configloader"
	"github.com/siderolabs/talos/pkg/machinery/config/encoder"
	"github.com/siderolabs/talos/pkg/machinery/config/machine"
	"github.com/siderolabs/talos/pkg/machinery/config/types/v1alpha1"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestStaged(t *testing.T) {
	active := generated114(t, machine.TypeWorker, "1.36.3")

	for _, tc := range []struct {
		name       string
		persistent func(t *testing.T) config.Provider
		want       string
	}{
		{
			name:       "no persistent config",
			persistent: func(*testing.T) config.Provider { return nil },
		},
		{
			name: "loaded from the same bytes",
			persistent: func(t *testing.T) config.Provider {
				b, err := active.Bytes()
				require.NoError(t, err)

				cfg, err := configloader.NewFromBytes(b)
				require.NoError(t, err)
				require.True(t, sameSource(active, cfg))

				return cfg
			},
		},
		{
			name: "other bytes, the same config (no comments)",
			persistent: func(t *testing.T) config.Provider {
				cfg := reload(t, active, encoder.WithComments(encoder.CommentsDisabled))
				require.False(t, sameSource(active, cfg), "the test's bytes differ")

				return cfg
			},
		},
		{
			name: "a label staged",
			persistent: func(t *testing.T) config.Provider {
				return patched(t, active, func(c *v1alpha1.Config) {
					c.MachineConfig.MachineNodeLabels = map[string]string{"rack": "r1"}
				})
			},
			want: "at machine.nodeLabels.rack",
		},
		{
			name:       "an image staged",
			persistent: func(t *testing.T) config.Provider { return rendered(t, active, Uniform("v1.37.2")) },
			want:       "at KubeletConfig: image",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			where, err := Staged(active, tc.persistent(t))
			require.NoError(t, err)
			assert.Equal(t, tc.want, where)
		})
	}
}

// rendered returns Render's config, loaded back as a node would hold it.
func rendered(t *testing.T, cfg config.Provider, want Versions) config.Provider {
	t.Helper()

	res, err := Render(cfg, want)
	require.NoError(t, err)

	return reload(t, res.Config)
}
