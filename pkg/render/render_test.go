package render

import (
	"fmt"
	"regexp"
	"strings"
	"testing"

	"github.com/siderolabs/talos/pkg/machinery/config"
	configconfig "github.com/siderolabs/talos/pkg/machinery/config/config"
	"github.com/siderolabs/talos/pkg/machinery/config/container"
	"github.com/siderolabs/talos/pkg/machinery/config/machine"
	"github.com/siderolabs/talos/pkg/machinery/config/types/k8s"
	"github.com/siderolabs/talos/pkg/machinery/config/types/network"
	"github.com/siderolabs/talos/pkg/machinery/config/types/v1alpha1"
	"github.com/siderolabs/talos/pkg/machinery/config/validation"
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
	// Certificates are not secrets, so Diff keeps them; they are generated
	// anew on every run, so the golden files hold a placeholder.
	b.WriteString(certificate.ReplaceAllString(diff, "${1}<certificate>"))

	return b.String()
}

// certificate matches a PEM certificate encoded in a config, as Diff shows it.
var certificate = regexp.MustCompile(`(crt: )LS0t[A-Za-z0-9+/=]+`)

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
		// Talos 1.14's layout: each image in its component's document.
		{
			name: "controlplane-multidoc",
			cfg:  func(t *testing.T) config.Provider { return generated114(t, machine.TypeControlPlane, "1.36.3") },
			want: Uniform("v1.37.2"),
		},
		{
			name: "worker-multidoc",
			cfg:  func(t *testing.T) config.Provider { return generated114(t, machine.TypeWorker, "1.36.3") },
			want: Uniform("v1.37.2"),
		},
		{
			name: "controlplane-multidoc-private-registry",
			cfg: func(t *testing.T) config.Provider {
				return mirroredDocs(t, generated114(t, machine.TypeControlPlane, "1.36.3"))
			},
			want: Uniform("v1.37.2"),
		},
		{
			name: "controlplane-multidoc-apiservers-stage",
			cfg:  func(t *testing.T) config.Provider { return generated114(t, machine.TypeControlPlane, "1.36.3") },
			want: Versions{APIServer: "v1.37.2", ControllerManager: "v1.36.3", Scheduler: "v1.36.3", KubeProxy: "v1.36.3", Kubelet: "v1.36.3"},
		},
		{
			name: "controlplane-multidoc-proxy-disabled",
			cfg: func(t *testing.T) config.Provider {
				return patchedWith(t, generated114(t, machine.TypeControlPlane, "1.36.3"),
					"apiVersion: v1alpha1\nkind: KubeProxyConfig\nenabled: false\n")
			},
			want: Uniform("v1.37.2"),
		},
		// A node with some components in each layout.
		{
			name: "controlplane-mixed",
			cfg:  func(t *testing.T) config.Provider { return mixed(t, "1.36.3") },
			want: Uniform("v1.37.2"),
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := tc.cfg(t)

			res, err := Render(before, tc.want)
			require.NoError(t, err)

			changed, err := Changes(before, tc.want)
			require.NoError(t, err)
			assert.Equal(t, res.Changed, changed, "Changes tells what Render changes")

			for _, ch := range res.Changed {
				assert.Equal(t, LayoutOf(before, ch.Component), ch.Layout, "%s changed where the node keeps it", ch.Component)
			}

			assert.Equal(t, Layouts(before), Layouts(res.Config), "no component changes layout")
			assertValid(t, res.Config)

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

	for _, layout := range []struct {
		name string
		cfg  func(t *testing.T, kubernetesVersion string) config.Provider
	}{
		{"v1alpha1", func(t *testing.T, v string) config.Provider { return generated(t, machine.TypeControlPlane, v) }},
		{"multi-doc", func(t *testing.T, v string) config.Provider { return generated114(t, machine.TypeControlPlane, v) }},
		{"mixed", mixed},
	} {
		t.Run(layout.name, func(t *testing.T) {
			renderStages(t, layout.cfg(t, "1.35.2"), stages, target)
		})
	}
}

func renderStages(t *testing.T, node config.Provider, stages []struct {
	name  string
	want  Versions
	moved []Component
}, target string,
) {
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
			assertValid(t, node)
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
			err:  "the machine config has no v1alpha1 machine section",
		},
		{
			name: "control plane without cluster section",
			cfg: func(t *testing.T) config.Provider {
				return patched(t, generated(t, machine.TypeControlPlane, "1.35.2"), func(c *v1alpha1.Config) {
					c.ClusterConfig = nil
				})
			},
			want: Uniform("v1.36.3"),
			err:  "the control plane's machine config has neither a cluster section nor a KubeAPIServerConfig document",
		},
		{
			name: "unparsable image in a document",
			cfg: func(t *testing.T) config.Provider {
				return patchedWith(t, generated114(t, machine.TypeWorker, "1.36.3"),
					"apiVersion: v1alpha1\nkind: KubeletConfig\nimage: ghcr.io/siderolabs/kubelet:v1.36.3:x\n")
			},
			want: Uniform("v1.37.2"),
			err:  "KubeletConfig: image: image \"ghcr.io/siderolabs/kubelet:v1.36.3:x\"",
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

			_, err = Changes(tc.cfg(t), tc.want)
			require.ErrorContains(t, err, tc.err, "Changes refuses what Render refuses")
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
			name: "control plane, multi-doc",
			cfg:  func(t *testing.T) config.Provider { return generated114(t, machine.TypeControlPlane, "1.36.3") },
			want: map[Component]string{
				APIServer:         "registry.k8s.io/kube-apiserver:v1.36.3",
				ControllerManager: "registry.k8s.io/kube-controller-manager:v1.36.3",
				Scheduler:         "registry.k8s.io/kube-scheduler:v1.36.3",
				KubeProxy:         "registry.k8s.io/kube-proxy:v1.36.3",
				Kubelet:           "ghcr.io/siderolabs/kubelet:v1.36.3",
			},
		},
		{
			name: "worker, multi-doc, private registry",
			cfg: func(t *testing.T) config.Provider {
				return mirroredDocs(t, generated114(t, machine.TypeWorker, "1.36.3"))
			},
			want: map[Component]string{Kubelet: "registry.example.com:5000/mirror/kubelet:v1.36.3"},
		},
		{
			name: "control plane, mixed",
			cfg:  func(t *testing.T) config.Provider { return mixed(t, "1.36.3") },
			want: map[Component]string{
				APIServer:         "registry.k8s.io/kube-apiserver:v1.36.3",
				ControllerManager: "registry.k8s.io/kube-controller-manager:v1.36.3",
				Scheduler:         "registry.k8s.io/kube-scheduler:v1.36.3",
				KubeProxy:         "registry.k8s.io/kube-proxy:v1.36.3",
				Kubelet:           "ghcr.io/siderolabs/kubelet:v1.36.3",
			},
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

func TestLayouts(t *testing.T) {
	all := func(l Layout) map[Component]Layout {
		m := map[Component]Layout{}
		for _, c := range Components() {
			m[c] = l
		}

		return m
	}

	assert.Equal(t, all(V1Alpha1), Layouts(generated(t, machine.TypeControlPlane, "1.35.2")))
	assert.Equal(t, all(Document), Layouts(generated114(t, machine.TypeControlPlane, "1.36.3")))
	assert.Equal(t, map[Component]Layout{Kubelet: Document}, Layouts(generated114(t, machine.TypeWorker, "1.36.3")))

	m := all(Document)
	m[Kubelet], m[APIServer] = V1Alpha1, V1Alpha1
	assert.Equal(t, m, Layouts(mixed(t, "1.36.3")))

	assert.Equal(t, "cluster.apiServer.image", APIServer.PathIn(V1Alpha1))
	assert.Equal(t, "KubeAPIServerConfig: image", APIServer.PathIn(Document))
	assert.Equal(t, "KubeletConfig: image", Kubelet.PathIn(Document))
}

// TestRenderNeverSetsBothLayouts shows that a component cannot end up in
// both layouts, which Talos refuses: Render patches the layout the node
// uses, and Verify refuses a config where an image moved to the other one.
func TestRenderNeverSetsBothLayouts(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  func(t *testing.T) config.Provider
	}{
		{"v1alpha1", func(t *testing.T) config.Provider { return generated(t, machine.TypeControlPlane, "1.36.3") }},
		{"multi-doc", func(t *testing.T) config.Provider { return generated114(t, machine.TypeControlPlane, "1.36.3") }},
		{"mixed", func(t *testing.T) config.Provider { return mixed(t, "1.36.3") }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := tc.cfg(t)

			res, err := Render(before, Uniform("v1.37.2"))
			require.NoError(t, err)
			require.Len(t, res.Changed, len(Components()))

			raw := res.Config.RawV1Alpha1()
			for _, c := range Components() {
				inDocument := res.Config.Has(c.Kind())
				assert.Equal(t, before.Has(c.Kind()), inDocument, "%s: document kept or not kept", c)

				if inDocument {
					assert.False(t, inV1Alpha1(raw, c), "%s is set in both layouts", c)
				}
			}

			assertValid(t, res.Config)
		})
	}

	t.Run("an image moved to its document is refused", func(t *testing.T) {
		before := generated(t, machine.TypeWorker, "1.36.3")

		moved := patched(t, before, func(c *v1alpha1.Config) { c.MachineConfig.MachineKubelet = nil })
		moved = patchedWith(t, moved, "apiVersion: v1alpha1\nkind: KubeletConfig\nimage: ghcr.io/siderolabs/kubelet:v1.37.2\n")

		var changed *UnexpectedChangeError
		require.ErrorAs(t, Verify(before, moved, Kubelet), &changed)
		assert.Contains(t, changed.Paths, "KubeletConfig: (document added)")
	})

	t.Run("an image moved to the v1alpha1 document is refused", func(t *testing.T) {
		before := generated114(t, machine.TypeWorker, "1.36.3")

		var docs []configconfig.Document

		for _, doc := range before.Documents() {
			if doc.Kind() != k8s.KubeletConfig {
				docs = append(docs, doc)
			}
		}

		c, err := container.New(docs...)
		require.NoError(t, err)

		moved := patched(t, c, func(c *v1alpha1.Config) {
			c.MachineConfig.MachineKubelet = &v1alpha1.KubeletConfig{KubeletImage: "ghcr.io/siderolabs/kubelet:v1.37.2"} //nolint:staticcheck // the legacy layout
		})

		var changed *UnexpectedChangeError
		require.ErrorAs(t, Verify(before, moved, Kubelet), &changed)
		assert.Contains(t, changed.Paths, "KubeletConfig: (document removed)")
		assert.Contains(t, changed.Paths, "machine.kubelet.image")
	})
}

// inV1Alpha1 reports whether the v1alpha1 document sets the component's
// section, which Talos refuses next to the component's own document.
func inV1Alpha1(raw *v1alpha1.Config, c Component) bool {
	if raw == nil {
		return false
	}

	switch c {
	case Kubelet:
		return raw.MachineConfig != nil && raw.MachineConfig.MachineKubelet != nil //nolint:staticcheck // the legacy layout
	case APIServer:
		return raw.ClusterConfig != nil && raw.ClusterConfig.APIServerConfig != nil //nolint:staticcheck // the legacy layout
	case ControllerManager:
		return raw.ClusterConfig != nil && raw.ClusterConfig.ControllerManagerConfig != nil //nolint:staticcheck // the legacy layout
	case Scheduler:
		return raw.ClusterConfig != nil && raw.ClusterConfig.SchedulerConfig != nil //nolint:staticcheck // the legacy layout
	case KubeProxy:
		return raw.ClusterConfig != nil && raw.ClusterConfig.ProxyConfig != nil //nolint:staticcheck // the legacy layout
	}

	return false
}

// assertValid checks cfg with machinery's own validation, as Talos checks an
// applied config (its conflict rules included: one component in both
// layouts is refused).
func assertValid(t *testing.T, cfg config.Provider) {
	t.Helper()

	_, err := cfg.ValidateAsClient(validationMode{}, validation.WithLocal())
	assert.NoError(t, err, "the config validates as Talos would")
}

// validationMode is Talos in a container (no install disk to check), the
// way the local cluster's machines validate.
type validationMode struct{}

func (validationMode) String() string        { return "container" }
func (validationMode) RequiresInstall() bool { return false }
func (validationMode) InContainer() bool     { return true }
