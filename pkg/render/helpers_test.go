package render

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/siderolabs/talos/pkg/machinery/config"
	configconfig "github.com/siderolabs/talos/pkg/machinery/config/config"
	"github.com/siderolabs/talos/pkg/machinery/config/configloader"
	"github.com/siderolabs/talos/pkg/machinery/config/configpatcher"
	"github.com/siderolabs/talos/pkg/machinery/config/container"
	"github.com/siderolabs/talos/pkg/machinery/config/encoder"
	"github.com/siderolabs/talos/pkg/machinery/config/generate"
	"github.com/siderolabs/talos/pkg/machinery/config/machine"
	"github.com/siderolabs/talos/pkg/machinery/config/types/k8s"
	"github.com/siderolabs/talos/pkg/machinery/config/types/v1alpha1"
	"github.com/stretchr/testify/require"
)

// update re-records the golden files; the run then fails so that a
// re-record never passes silently.
var update = flag.Bool("update", false, "re-record the golden files in testdata (the run fails afterwards)")

const testDigest = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

// generated returns a machine config as `talosctl gen config` of Talos 1.13
// would make it (every image in the v1alpha1 document), loaded back from its
// bytes (comments included) as a node's active config is, so the tests see
// the read-only container the Talos API gives. A node upgraded from Talos
// 1.13 to 1.14 keeps such a config.
func generated(t *testing.T, typ machine.Type, kubernetesVersion string) config.Provider {
	t.Helper()

	return generatedFor(t, config.TalosVersion1_13, typ, kubernetesVersion)
}

// generated114 returns a machine config as `talosctl gen config` of Talos
// 1.14 makes it: each image in its component's own document.
func generated114(t *testing.T, typ machine.Type, kubernetesVersion string) config.Provider {
	t.Helper()

	return generatedFor(t, config.TalosVersion1_14, typ, kubernetesVersion)
}

func generatedFor(t *testing.T, contract *config.VersionContract, typ machine.Type, kubernetesVersion string) config.Provider {
	t.Helper()

	in, err := generate.NewInput("prod", "https://10.0.0.10:6443", kubernetesVersion,
		generate.WithVersionContract(contract))
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

// patchedWith returns cfg changed by a strategic merge patch (YAML, one or
// more documents), loaded back as a node would hold it.
func patchedWith(t *testing.T, cfg config.Provider, patch string) config.Provider {
	t.Helper()

	p, err := configpatcher.LoadPatch([]byte(patch))
	require.NoError(t, err)

	out, err := configpatcher.Apply(configpatcher.WithConfig(cfg), []configpatcher.Patch{p})
	require.NoError(t, err)

	patched, err := out.Config()
	require.NoError(t, err)

	return reload(t, patched)
}

// mixed returns a Talos 1.14 control plane config of the kind a node has
// when some components were moved to their documents and some were not:
// the kubelet and kube-apiserver in the v1alpha1 document, the rest in their
// own documents.
func mixed(t *testing.T, kubernetesVersion string) config.Provider {
	t.Helper()

	multi := generated114(t, machine.TypeControlPlane, kubernetesVersion)

	var docs []configconfig.Document

	for _, doc := range multi.Documents() {
		if doc.Kind() == k8s.KubeletConfig || doc.Kind() == k8s.KubeAPIServerConfig {
			continue
		}

		docs = append(docs, doc)
	}

	c, err := container.New(docs...)
	require.NoError(t, err)

	return patched(t, c, func(c *v1alpha1.Config) {
		c.MachineConfig.MachineKubelet = &v1alpha1.KubeletConfig{ //nolint:staticcheck // the legacy layout
			KubeletImage: "ghcr.io/siderolabs/kubelet:v" + kubernetesVersion,
		}

		if c.ClusterConfig == nil {
			c.ClusterConfig = &v1alpha1.ClusterConfig{}
		}

		c.ClusterConfig.APIServerConfig = &v1alpha1.APIServerConfig{ //nolint:staticcheck // the legacy layout
			ContainerImage: "registry.k8s.io/kube-apiserver:v" + kubernetesVersion,
		}
	})
}

// mirroredDocs moves the image of every component document of cfg to a
// private registry path, keeping the tag.
func mirroredDocs(t *testing.T, cfg config.Provider) config.Provider {
	t.Helper()

	var patch []string

	for c, image := range Images(cfg) {
		if LayoutOf(cfg, c) != Document {
			continue
		}

		patch = append(patch, fmt.Sprintf("apiVersion: v1alpha1\nkind: %s\nimage: registry.example.com:5000/mirror/%s\n",
			c.Kind(), image[strings.LastIndexByte(image, '/')+1:]))
	}

	slices.Sort(patch)

	return patchedWith(t, cfg, strings.Join(patch, "---\n"))
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
