package render

import (
	"fmt"
	"strings"
	"testing"

	"github.com/siderolabs/talos/pkg/machinery/config"
	"github.com/siderolabs/talos/pkg/machinery/config/container"
	"github.com/siderolabs/talos/pkg/machinery/config/machine"
	"github.com/siderolabs/talos/pkg/machinery/config/types/network"
	"github.com/siderolabs/talos/pkg/machinery/config/types/v1alpha1"
	"github.com/siderolabs/talos/pkg/machinery/constants"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// describe writes a render as the golden files hold it: what changed, what
// was skipped, and the redacted diff.
func describe(t *testing.T, before config.Provider, res *Result) string {
	t.Helper()

	var b strings.Builder

	b.WriteString("# changed\n")

	for _, ch := range res.Changed {
		fmt.Fprintf(&b, "%s %s: %s -> %s", ch.Component, ch.Path, ch.From, ch.To)

		if ch.DroppedDigest != "" {
			fmt.Fprintf(&b, " (dropped digest %s)", ch.DroppedDigest)
		}

		b.WriteString("\n")
	}

	b.WriteString("# skipped\n")

	for _, c := range Components() {
		if reason, ok := res.Skipped[c]; ok {
			fmt.Fprintf(&b, "%s: %s\n", c, reason)
		}
	}

	diff, err := Diff(before, res.Config)
	require.NoError(t, err)

	b.WriteString("# diff\n")
	b.WriteString(diff)

	return b.String()
}

func TestRenderGolden(t *testing.T) {
	target := Uniform("v1.36.3")

	// pinned is the APIServers stage of a node whose kubelet runs v1.35.2.
	pinned := Uniform("v1.35.2")
	pinned[APIServer] = "v1.36.3"

	for _, tc := range []struct {
		name string
		cfg  func(t *testing.T) config.Provider
		want Versions
	}{
		{
			name: "controlplane-default",
			cfg:  func(t *testing.T) config.Provider { return generated(t, machine.TypeControlPlane, "1.35.2") },
			want: target,
		},
		{
			name: "controlplane-private-registry",
			cfg: func(t *testing.T) config.Provider {
				return mirrored(t, generated(t, machine.TypeControlPlane, "1.35.4"))
			},
			want: target,
		},
		{
			name: "worker-default",
			cfg:  func(t *testing.T) config.Provider { return generated(t, machine.TypeWorker, "1.35.2") },
			want: target,
		},
		{
			name: "worker-private-registry",
			cfg:  func(t *testing.T) config.Provider { return mirrored(t, generated(t, machine.TypeWorker, "1.35.0")) },
			want: target,
		},
		{
			name: "controlplane-apiservers-stage",
			cfg:  func(t *testing.T) config.Provider { return generated(t, machine.TypeControlPlane, "1.35.2") },
			want: pinned,
		},
		{
			name: "controlplane-proxy-disabled",
			cfg: func(t *testing.T) config.Provider {
				return patched(t, generated(t, machine.TypeControlPlane, "1.35.2"), func(c *v1alpha1.Config) {
					c.ClusterConfig.ProxyConfig.Disabled = new(true)
				})
			},
			want: target,
		},
		{
			name: "controlplane-digest-pinned",
			cfg: func(t *testing.T) config.Provider {
				return patched(t, mirrored(t, generated(t, machine.TypeControlPlane, "1.35.2")), func(c *v1alpha1.Config) {
					c.ClusterConfig.APIServerConfig.ContainerImage += "@" + testDigest
					c.ClusterConfig.SchedulerConfig.ContainerImage = "registry.example.com:5000/mirror/kube-scheduler@" + testDigest
				})
			},
			want: target,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := tc.cfg(t)

			res, err := Render(before, tc.want)
			require.NoError(t, err)

			golden(t, tc.name, describe(t, before, res))
		})
	}
}

// TestRenderStages walks a control plane through the four stages as
// pkg/stages pins them and checks that each stage moves only its own images.
func TestRenderStages(t *testing.T) {
	const (
		running = "v1.35.2"
		target  = "v1.36.3"
	)

	pin := func(atTarget ...Component) Versions {
		v := Uniform(running)
		for _, c := range atTarget {
			v[c] = target
		}

		return v
	}

	stages := []struct {
		name  string
		want  Versions
		moved []Component
	}{
		{"APIServers", pin(APIServer), []Component{APIServer}},
		{"ControlPlaneComponents", pin(APIServer, ControllerManager, Scheduler), []Component{ControllerManager, Scheduler}},
		{"KubeProxy", pin(APIServer, ControllerManager, Scheduler, KubeProxy), []Component{KubeProxy}},
		{"Kubelets", Uniform(target), []Component{Kubelet}},
	}

	node := generated(t, machine.TypeControlPlane, "1.35.2")

	for _, stage := range stages {
		t.Run(stage.name, func(t *testing.T) {
			res, err := Render(node, stage.want)
			require.NoError(t, err)

			var moved []Component
			for _, ch := range res.Changed {
				moved = append(moved, ch.Component)
			}

			assert.Equal(t, stage.moved, moved)

			// The node now runs the render, as Talos would hold it.
			node = reload(t, res.Config)

			again, err := Render(node, stage.want)
			require.NoError(t, err)
			assert.Empty(t, again.Changed, "a second render of the same stage changes nothing")
			assert.Equal(t, res.Hash, again.Hash)
		})
	}

	images := Images(node)
	for _, c := range Components() {
		assert.Equal(t, target, TagOf(images[c]), c)
	}
}

func TestRenderKeepsOtherDocuments(t *testing.T) {
	before := generated(t, machine.TypeControlPlane, "1.35.2")
	require.Greater(t, len(before.Documents()), 1, "the generated config is multi-document")

	res, err := Render(before, Uniform("v1.36.3"))
	require.NoError(t, err)

	after := res.Config.Documents()
	require.Len(t, after, len(before.Documents()))

	for i, doc := range before.Documents() {
		if doc.Kind() == v1alpha1.Version {
			continue
		}

		b, err := container.New(doc)
		require.NoError(t, err)
		a, err := container.New(after[i])
		require.NoError(t, err)

		bh, err := Hash(b)
		require.NoError(t, err)
		ah, err := Hash(a)
		require.NoError(t, err)
		assert.Equal(t, bh, ah, "document %s", doc.Kind())
	}

	assert.NoError(t, Verify(before, res.Config))
}

func TestRenderEmptyImageFieldUsesDefault(t *testing.T) {
	before := patched(t, generated(t, machine.TypeControlPlane, "1.35.2"), func(c *v1alpha1.Config) {
		c.ClusterConfig.APIServerConfig.ContainerImage = ""
		c.ClusterConfig.ProxyConfig = nil
	})

	images := Images(before)
	assert.Equal(t, constants.KubernetesAPIServerImage+":v"+constants.DefaultKubernetesVersion, images[APIServer])
	assert.Equal(t, constants.KubeProxyImage+":v"+constants.DefaultKubernetesVersion, images[KubeProxy])

	res, err := Render(before, Versions{APIServer: "v1.36.3", KubeProxy: "v1.36.3"})
	require.NoError(t, err)

	images = Images(res.Config)
	assert.Equal(t, constants.KubernetesAPIServerImage+":v1.36.3", images[APIServer])
	assert.Equal(t, constants.KubeProxyImage+":v1.36.3", images[KubeProxy])
}

func TestRenderVersionForms(t *testing.T) {
	node := generated(t, machine.TypeWorker, "1.35.2")

	for _, tc := range []struct {
		version string
		want    string
		err     string
	}{
		{version: "v1.36.3", want: "ghcr.io/siderolabs/kubelet:v1.36.3"},
		// The "vv" bug of seed 001: a bare version gets exactly one v.
		{version: "1.36.3", want: "ghcr.io/siderolabs/kubelet:v1.36.3"},
		{version: " v1.36.3 ", want: "ghcr.io/siderolabs/kubelet:v1.36.3"},
		{version: "vv1.36.3", err: `kubelet: version "vv1.36.3" has a doubled v: give it as v1.36.3`},
		{version: "", err: "kubelet: empty version"},
		{version: "v1.36.3/x", err: `kubelet: version "v1.36.3/x" is not a valid image tag`},
	} {
		t.Run(fmt.Sprintf("%q", tc.version), func(t *testing.T) {
			res, err := Render(node, Versions{Kubelet: tc.version})
			if tc.err != "" {
				require.ErrorContains(t, err, tc.err)

				return
			}

			require.NoError(t, err)
			assert.Equal(t, tc.want, Images(res.Config)[Kubelet])
		})
	}
}

func TestRenderRefuses(t *testing.T) {
	hostnameOnly := func(t *testing.T) config.Provider {
		c, err := container.New(network.NewHostnameConfigV1Alpha1())
		require.NoError(t, err)

		return c
	}

	for _, tc := range []struct {
		name string
		cfg  func(t *testing.T) config.Provider
		want Versions
		err  string
	}{
		{
			name: "no config",
			cfg:  func(*testing.T) config.Provider { return nil },
			want: Uniform("v1.36.3"),
			err:  "no machine config",
		},
		{
			name: "no v1alpha1 document",
			cfg:  hostnameOnly,
			want: Uniform("v1.36.3"),
			err:  "the machine config has no v1alpha1 document",
		},
		{
			name: "control plane without cluster section",
			cfg: func(t *testing.T) config.Provider {
				return patched(t, generated(t, machine.TypeControlPlane, "1.35.2"), func(c *v1alpha1.Config) {
					c.ClusterConfig = nil
				})
			},
			want: Uniform("v1.36.3"),
			err:  "the control plane's machine config has no cluster section",
		},
		{
			name: "unknown machine type",
			cfg: func(t *testing.T) config.Provider {
				return patched(t, generated(t, machine.TypeWorker, "1.35.2"), func(c *v1alpha1.Config) {
					c.MachineConfig.MachineType = "toaster"
				})
			},
			want: Uniform("v1.36.3"),
			err:  `machine.type "toaster" is neither controlplane nor worker`,
		},
		{
			name: "unknown component",
			cfg:  func(t *testing.T) config.Provider { return generated(t, machine.TypeWorker, "1.35.2") },
			want: Versions{"etcd": "v3.6.0"},
			err:  `unknown component "etcd"`,
		},
		{
			name: "unparsable image in the config",
			cfg: func(t *testing.T) config.Provider {
				return patched(t, generated(t, machine.TypeWorker, "1.35.2"), func(c *v1alpha1.Config) {
					c.MachineConfig.MachineKubelet.KubeletImage = "ghcr.io/siderolabs/kubelet:"
				})
			},
			want: Uniform("v1.36.3"),
			err:  "machine.kubelet.image: image \"ghcr.io/siderolabs/kubelet:\"",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Render(tc.cfg(t), tc.want)
			require.ErrorContains(t, err, tc.err)
		})
	}
}

func TestImages(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  func(t *testing.T) config.Provider
		want map[Component]string
	}{
		{
			name: "control plane",
			cfg:  func(t *testing.T) config.Provider { return generated(t, machine.TypeControlPlane, "1.35.2") },
			want: map[Component]string{
				APIServer:         "registry.k8s.io/kube-apiserver:v1.35.2",
				ControllerManager: "registry.k8s.io/kube-controller-manager:v1.35.2",
				Scheduler:         "registry.k8s.io/kube-scheduler:v1.35.2",
				KubeProxy:         "registry.k8s.io/kube-proxy:v1.35.2",
				Kubelet:           "ghcr.io/siderolabs/kubelet:v1.35.2",
			},
		},
		{
			name: "worker",
			cfg:  func(t *testing.T) config.Provider { return mirrored(t, generated(t, machine.TypeWorker, "1.35.2")) },
			want: map[Component]string{Kubelet: "registry.example.com:5000/mirror/kubelet:v1.35.2"},
		},
		{
			name: "no v1alpha1 document",
			cfg: func(t *testing.T) config.Provider {
				c, err := container.New(network.NewHostnameConfigV1Alpha1())
				require.NoError(t, err)

				return c
			},
			want: map[Component]string{},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, Images(tc.cfg(t)))
		})
	}
}

func TestHash(t *testing.T) {
	cfg := generated(t, machine.TypeControlPlane, "1.35.2")

	h1, err := Hash(cfg)
	require.NoError(t, err)
	require.Len(t, h1, 64)

	t.Run("stable", func(t *testing.T) {
		h2, err := Hash(cfg)
		require.NoError(t, err)
		assert.Equal(t, h1, h2)
	})

	t.Run("comments and formatting do not count", func(t *testing.T) {
		h, err := Hash(reload(t, cfg))
		require.NoError(t, err)
		assert.Equal(t, h1, h)
	})

	t.Run("a render hashes as its applied bytes", func(t *testing.T) {
		res, err := Render(cfg, Uniform("v1.36.3"))
		require.NoError(t, err)

		applied := reload(t, res.Config)
		h, err := Hash(applied)
		require.NoError(t, err)
		assert.Equal(t, res.Hash, h)
		assert.NotEqual(t, h1, h)
	})

	t.Run("a render with nothing to change hashes as the node", func(t *testing.T) {
		res, err := Render(cfg, Uniform("v1.35.2"))
		require.NoError(t, err)
		assert.Empty(t, res.Changed)
		assert.Equal(t, h1, res.Hash)
	})

	t.Run("any change counts", func(t *testing.T) {
		h, err := Hash(patched(t, cfg, func(c *v1alpha1.Config) {
			c.ClusterConfig.ClusterName = "other"
		}))
		require.NoError(t, err)
		assert.NotEqual(t, h1, h)
	})
}
