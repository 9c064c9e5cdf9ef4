package render

import (
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/siderolabs/talos/pkg/machinery/config"
	"github.com/siderolabs/talos/pkg/machinery/config/configloader"
	"github.com/siderolabs/talos/pkg/machinery/config/encoder"
	"github.com/siderolabs/talos/pkg/machinery/config/generate"
	"github.com/siderolabs/talos/pkg/machinery/config/machine"
	"github.com/siderolabs/talos/pkg/machinery/config/types/v1alpha1"
	"github.com/stretchr/testify/require"
)

// update re-records the golden files; the run then fails so that a
// re-record never passes silently.
var update = flag.Bool("update", false, "re-record the golden files in testdata (the run fails afterwards)")

const testDigest = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

// generated returns a machine config as `talosctl gen config` would make it,
// loaded back from its bytes (comments included) as a node's active config
// is, so the tests see the read-only container the Talos API gives.
func generated(t *testing.T, typ machine.Type, kubernetesVersion string) config.Provider {
	t.Helper()

	in, err := generate.NewInput("prod", "https://10.0.0.10:6443", kubernetesVersion)
	require.NoError(t, err)

	cfg, err := in.Config(typ)
	require.NoError(t, err)

	return reload(t, cfg, encoder.WithComments(encoder.CommentsAll))
}

// reload encodes cfg and loads it back.
func reload(t *testing.T, cfg config.Provider, opts ...encoder.Option) config.Provider {
	t.Helper()

	b, err := cfg.EncodeBytes(opts...)
	require.NoError(t, err)

	loaded, err := configloader.NewFromBytes(b)
	require.NoError(t, err)

	return loaded
}

// patched returns cfg changed by fn, loaded back as a node would hold it.
func patched(t *testing.T, cfg config.Provider, fn func(*v1alpha1.Config)) config.Provider {
	t.Helper()

	out, err := cfg.Clone().PatchV1Alpha1(func(c *v1alpha1.Config) error {
		fn(c)

		return nil
	})
	require.NoError(t, err)

	return reload(t, out)
}

// mirrored moves every image of cfg that is set to a private registry path,
// keeping the tag: registry.k8s.io/kube-apiserver:v1.35.2 becomes
// registry.example.com:5000/mirror/kube-apiserver:v1.35.2.
func mirrored(t *testing.T, cfg config.Provider) config.Provider {
	t.Helper()

	mirror := func(image string) string {
		if image == "" {
			return ""
		}

		return "registry.example.com:5000/mirror/" + image[strings.LastIndexByte(image, '/')+1:]
	}

	return patched(t, cfg, func(c *v1alpha1.Config) {
		if k := c.MachineConfig.MachineKubelet; k != nil {
			k.KubeletImage = mirror(k.KubeletImage)
		}

		if cl := c.ClusterConfig; cl != nil {
			if cl.APIServerConfig != nil {
				cl.APIServerConfig.ContainerImage = mirror(cl.APIServerConfig.ContainerImage)
			}

			if cl.ControllerManagerConfig != nil {
				cl.ControllerManagerConfig.ContainerImage = mirror(cl.ControllerManagerConfig.ContainerImage)
			}

			if cl.SchedulerConfig != nil {
				cl.SchedulerConfig.ContainerImage = mirror(cl.SchedulerConfig.ContainerImage)
			}

			if cl.ProxyConfig != nil {
				cl.ProxyConfig.ContainerImage = mirror(cl.ProxyConfig.ContainerImage)
			}
		}
	})
}

// golden compares got with testdata/name.golden, or re-records it with
// -update and fails the run.
func golden(t *testing.T, name, got string) {
	t.Helper()

	path := filepath.Join("testdata", name+".golden")

	if *update {
		require.NoError(t, os.WriteFile(path, []byte(got), 0o644))
		t.Fatalf("re-recorded %s: run again without -update", path)
	}

	want, err := os.ReadFile(path)
	require.NoError(t, err, "no golden file: record it with go test ./pkg/render -update")
	require.Equal(t, string(want), got, "rendered output differs from %s (re-record with -update if intended)", path)
}
