package cluster

import (
	"net"
	"testing"

	"github.com/siderolabs/talos/pkg/machinery/config/configloader"
	"github.com/siderolabs/talos/pkg/machinery/config/types/k8s"
	"github.com/stretchr/testify/require"
)

func TestValidate(t *testing.T) {
	good := func() Options {
		return Options{Dir: t.TempDir(), ControlPlanes: 3, Workers: 2, KubernetesVersion: "v1.35.4", TalosVersion: "v1.13.9", BinDir: "/bin"}
	}
	for _, tc := range []struct {
		name   string
		mutate func(*Options)
		want   string
	}{
		{"ok", func(*Options) {}, ""},
		{"no dir", func(o *Options) { o.Dir = "" }, "--dir is required"},
		{"no control plane", func(o *Options) { o.ControlPlanes = 0 }, "at least 1 control plane"},
		{"negative workers", func(o *Options) { o.Workers = -1 }, "cannot be negative"},
		{"too many", func(o *Options) { o.Workers = maxMachines }, "at most"},
		{"kubernetes without v", func(o *Options) { o.KubernetesVersion = "1.35.4" }, "want a version like v1.35.4"},
		{"talos not a version", func(o *Options) { o.TalosVersion = "latest" }, "want a version like v1.12.4"},
		{"pairing", func(o *Options) { o.KubernetesVersion = "v1.37.0" }, "pick a pair that Talos supports"},
		{"no bin dir", func(o *Options) { o.BinDir = "" }, "make cluster-bins"},
		{"inline manifest without a name", func(o *Options) { o.InlineManifests = []InlineManifest{{Contents: "a: b"}} }, "a name of its own"},
		{"inline manifests of one name", func(o *Options) {
			o.InlineManifests = []InlineManifest{{Name: "cni", Contents: "a: b"}, {Name: "cni", Contents: "c: d"}}
		}, `--inline-manifest "cni": give each inline manifest a name of its own`},
		{"extra manifest not a URL", func(o *Options) { o.ExtraManifests = []string{"/tmp/x.yaml"} }, "want an http or https URL"},
		{"born on an older Talos", func(o *Options) { o.BornOn = "v1.12.4" }, ""},
		{"born on a newer Talos", func(o *Options) { o.BornOn = "v1.14.1" }, "--born-on v1.14.1 is newer than --talos v1.13.9"},
		{"born on not a version", func(o *Options) { o.BornOn = "1.12" }, "want a Talos version like v1.12.4"},
		{"boot loader of no machine", func(o *Options) { o.BootLoaders = map[string]string{"worker-9": BootLoaderGRUB} }, "no machine worker-9"},
		{"unknown boot loader", func(o *Options) { o.BootLoaders = map[string]string{"worker-1": "lilo"} }, "want grub or sd-boot"},
		{"kernel args of no machine", func(o *Options) { o.KernelArgs = map[string][]string{"cp-9": {"console=ttyS0"}} }, "--kernel-args cp-9=...: no machine cp-9"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := good()
			tc.mutate(&o)
			err := o.Validate()
			if tc.want == "" {
				require.NoError(t, err)
				require.Equal(t, DefaultLatency(), o.Latency)
				require.Equal(t, "ichor-sim", o.Name)
				require.NotEmpty(t, o.BornOn, "defaults to --talos")
				return
			}
			require.ErrorContains(t, err, tc.want)
		})
	}
}

func TestAddressPlan(t *testing.T) {
	p, err := pickAddresses(t.TempDir(), 5)
	require.NoError(t, err)
	b := p.base.As4()
	require.Equal(t, byte(127), b[0])
	require.Zero(t, b[2]%16, "a /20 block")
	require.Equal(t, p.offset(1), p.apiServer())
	require.Equal(t, p.offset(10), p.machine(0))
	// Machine addresses run on across octets without colliding.
	seen := map[string]bool{}
	for i := range 600 {
		a := p.machine(i).String()
		require.False(t, seen[a], a)
		seen[a] = true
	}

	// A taken block is skipped.
	l, err := net.Listen("tcp", p.apiServer().String()+":6443")
	require.NoError(t, err)
	defer l.Close()
	q, err := pickAddresses(t.TempDir(), 5)
	require.NoError(t, err)
	require.NotEqual(t, p.base, q.base)
}

// A cluster larger than a block of addresses runs on into the next blocks,
// which must be free of other clusters' machines.
func TestAddressPlanSpansBlocks(t *testing.T) {
	require.Equal(t, 1, blocksFor(4086))
	require.Equal(t, 2, blocksFor(4087))
	require.Equal(t, 2, blocksFor(5000))

	dir := t.TempDir()
	p, err := pickAddresses(dir, 5000)
	require.NoError(t, err)
	seen := map[string]bool{p.apiServer().String(): true}
	for i := range 5000 {
		a := p.machine(i)
		require.False(t, seen[a.String()], a)
		require.Equal(t, byte(127), a.As4()[0])
		seen[a.String()] = true
	}

	// Another cluster's first machine in the second block: not free.
	l, err := net.Listen("tcp", p.offset(blockAddrs+10).String()+":50000")
	require.NoError(t, err)
	defer l.Close()
	q, err := pickAddresses(dir, 5000)
	require.NoError(t, err)
	require.NotEqual(t, p.base, q.base)
	// A cluster of one block does not look past it.
	r, err := pickAddresses(dir, 5)
	require.NoError(t, err)
	require.Equal(t, p.base, r.base)
}

// 5000 machines fit the addresses; what may refuse them is the machine's
// limit of open files, saying so.
func TestValidateManyMachines(t *testing.T) {
	o := Options{Dir: t.TempDir(), ControlPlanes: 3, Workers: 4997, KubernetesVersion: "v1.36.3", TalosVersion: "v1.14.1", BinDir: "/bin"}
	if err := o.Validate(); err != nil {
		require.ErrorContains(t, err, "open files")
	}

	require.NoError(t, checkOpenFiles(5000, 20000))
	err := checkOpenFiles(10000, 20000)
	require.ErrorContains(t, err, "10000 machines need about 21024 open files")
	require.ErrorContains(t, err, "ulimit -Hn")
}

func TestGeneratedConfigs(t *testing.T) {
	o := Options{Dir: t.TempDir(), ControlPlanes: 2, Workers: 1, KubernetesVersion: "v1.35.4", TalosVersion: "v1.13.9", BinDir: "/bin", TalosAPIAccess: true}
	require.NoError(t, o.Validate())
	p, err := pickAddresses(o.Dir, o.ControlPlanes+o.Workers)
	require.NoError(t, err)
	g, err := generateConfigs(o, p, nil)
	require.NoError(t, err)
	require.Len(t, g.machines, 3)
	require.Equal(t, []string{"cp-1", "cp-2", "worker-1"}, []string{g.machines[0].Name, g.machines[1].Name, g.machines[2].Name})
	require.Contains(t, string(g.machines[0].Config), "hostname: cp-1")
	require.Contains(t, string(g.machines[0].Config), "registry.k8s.io/kube-apiserver:v1.35.4")
	require.Contains(t, string(g.machines[0].Config), "kubernetesTalosAPIAccess")
	require.Contains(t, string(g.machines[2].Config), "ghcr.io/siderolabs/kubelet:v1.35.4")
	require.NotContains(t, string(g.machines[2].Config), "kubernetesTalosAPIAccess", "only control planes serve it")
	require.Equal(t, []string{p.machine(0).String(), p.machine(1).String()}, g.talosconfig.Contexts[g.talosconfig.Context].Endpoints)
	require.NotContains(t, string(g.machines[0].Config), "inlineManifests")

	// The user's manifests go to the control planes only.
	o.InlineManifests = []InlineManifest{{Name: "cni", Contents: "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: cni\n"}}
	o.ExtraManifests = []string{"http://127.0.0.1:1/cni.yaml"}
	g, err = generateConfigs(o, p, nil)
	require.NoError(t, err)
	for _, m := range g.machines {
		cfg, err := configloader.NewFromBytes(m.Config)
		require.NoError(t, err)
		var names, urls []string
		for _, im := range cfg.K8sInlineManifestConfigs() {
			names = append(names, im.Name())
		}
		for _, em := range cfg.K8sExternalManifestConfigs() {
			urls = append(urls, em.URL())
		}
		if m.ControlPlane {
			require.Equal(t, []string{"cni"}, names, m.Name)
			require.Equal(t, o.ExtraManifests, urls, m.Name)
		} else {
			require.Empty(t, names, m.Name)
			require.Empty(t, urls, m.Name)
		}
	}
}

// TestBornOnAndKernelArgs: a cluster born on Talos 1.13 and running 1.14 keeps the
// v1alpha1 layout that 1.13 generated; --kernel-args land in the node's
// machine.install, with the UKI command line off, as Talos requires.
func TestBornOnAndKernelArgs(t *testing.T) {
	o := Options{Dir: t.TempDir(), ControlPlanes: 1, Workers: 1, KubernetesVersion: "v1.35.4", TalosVersion: "v1.14.1", BornOn: "v1.13.9", BinDir: "/bin",
		KernelArgs: map[string][]string{"worker-1": {"console=ttyS1", "net.ifnames=0"}}}
	require.NoError(t, o.Validate())
	require.Equal(t, LayoutV1Alpha1, o.ConfigLayout, "as Talos 1.13 generated it")
	p, err := pickAddresses(o.Dir, o.ControlPlanes+o.Workers)
	require.NoError(t, err)
	g, err := generateConfigs(o, p, nil)
	require.NoError(t, err)
	cfg, err := configloader.NewFromBytes(g.machines[1].Config)
	require.NoError(t, err)
	require.Equal(t, []string{"console=ttyS1", "net.ifnames=0"}, cfg.Machine().Install().ExtraKernelArgs())
	require.False(t, cfg.Machine().Install().GrubUseUKICmdline())
	cp, err := configloader.NewFromBytes(g.machines[0].Config)
	require.NoError(t, err)
	require.Empty(t, cp.Machine().Install().ExtraKernelArgs())
	require.False(t, cp.Has(k8s.KubeletConfig), "no 1.14 documents")
}

func TestConfigLayoutOption(t *testing.T) {
	for _, tc := range []struct {
		talos, layout string
		want, err     string
	}{
		{talos: "v1.13.9", want: LayoutV1Alpha1},
		{talos: "v1.14.1", want: LayoutMultiDoc},
		{talos: "v1.14.1", layout: LayoutV1Alpha1, want: LayoutV1Alpha1},
		{talos: "v1.14.1", layout: LayoutMixed, want: LayoutMixed},
		{talos: "v1.13.9", layout: LayoutMultiDoc, err: "--config-layout multi-doc needs Talos 1.14 or later"},
		{talos: "v1.14.1", layout: "yaml", err: `--config-layout "yaml": want one of v1alpha1, multi-doc, mixed`},
	} {
		t.Run(tc.talos+"/"+tc.layout, func(t *testing.T) {
			o := Options{Dir: t.TempDir(), ControlPlanes: 1, KubernetesVersion: "v1.35.4", TalosVersion: tc.talos, ConfigLayout: tc.layout, BinDir: "/bin"}
			err := o.Validate()
			if tc.err != "" {
				require.ErrorContains(t, err, tc.err)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.want, o.ConfigLayout)
		})
	}
}

// TestGeneratedConfigLayouts checks where each layout keeps the Kubernetes
// settings, that every config loads and validates as Talos 1.14 would (no
// component in both layouts), and the Talos API access form each gets.
func TestGeneratedConfigLayouts(t *testing.T) {
	// kinds are the component documents of a Talos 1.14 config.
	kinds := []string{k8s.KubeletConfig, k8s.KubeAPIServerConfig, k8s.KubeControllerManagerConfig, k8s.KubeSchedulerConfig, k8s.KubeProxyConfig}
	for _, tc := range []struct {
		layout string
		// docs[i] are the component documents machine i has (cp-1, cp-2, cp-3, worker-1).
		docs [][]string
		// access[i] is the Talos API access form of control plane i.
		access []string
	}{
		{layout: LayoutV1Alpha1, docs: [][]string{nil, nil, nil, nil}, access: []string{"v1alpha1", "v1alpha1", "v1alpha1"}},
		{layout: LayoutMultiDoc, docs: [][]string{kinds, kinds, kinds, {k8s.KubeletConfig}}, access: []string{"document", "document", "document"}},
		{
			layout: LayoutMixed,
			docs:   [][]string{nil, kinds, {k8s.KubeControllerManagerConfig, k8s.KubeSchedulerConfig, k8s.KubeProxyConfig}, nil},
			access: []string{"v1alpha1", "document", "document"},
		},
	} {
		t.Run(tc.layout, func(t *testing.T) {
			o := Options{Dir: t.TempDir(), ControlPlanes: 3, Workers: 1, KubernetesVersion: "v1.36.3", TalosVersion: "v1.14.1", ConfigLayout: tc.layout, BinDir: "/bin", TalosAPIAccess: true}
			require.NoError(t, o.Validate())
			p, err := pickAddresses(o.Dir, o.ControlPlanes+o.Workers)
			require.NoError(t, err)
			g, err := generateConfigs(o, p, nil)
			require.NoError(t, err)
			require.Len(t, g.machines, 4)
			for i, m := range g.machines {
				cfg, err := configloader.NewFromBytes(m.Config)
				require.NoError(t, err, m.Name)
				_, err = cfg.ValidateAsClient(containerMode{})
				require.NoError(t, err, "%s validates as Talos 1.14 would", m.Name)
				var has []string
				for _, k := range kinds {
					if cfg.Has(k) {
						has = append(has, k)
					}
				}
				require.Equal(t, tc.docs[i], has, m.Name)
				require.Equal(t, "ghcr.io/siderolabs/kubelet:v1.36.3", cfg.K8sKubeletConfig().Image(), m.Name)
				if !m.ControlPlane {
					require.Nil(t, cfg.K8sTalosAPIAccessConfig(), "only control planes serve it")
					continue
				}
				require.Equal(t, "registry.k8s.io/kube-apiserver:v1.36.3", cfg.K8sAPIServerConfig().Image(), m.Name)
				require.NotNil(t, cfg.K8sTalosAPIAccessConfig(), m.Name)
				form := "v1alpha1"
				if cfg.Has(k8s.KubeTalosAPIAccessConfig) {
					form = "document"
				}
				require.Equal(t, tc.access[i], form, m.Name)
			}
		})
	}
}

// containerMode validates as Talos does in a container (no install disk).
type containerMode struct{}

func (containerMode) String() string        { return "container" }
func (containerMode) RequiresInstall() bool { return false }
func (containerMode) InContainer() bool     { return true }

// A controller keeps its default API rate in a cluster of up to 50 x its
// rate machines, then gets a request a second per 50 machines.
func TestWithAPIRate(t *testing.T) {
	require.Equal(t, []string{"--v=1"}, withAPIRate(1000, 20, 30, "--v=1"))
	require.Equal(t, []string{"--v=1", "--kube-api-qps=100", "--kube-api-burst=150"}, withAPIRate(5000, 20, 30, "--v=1"))
	require.Equal(t, []string{"--v=1"}, withAPIRate(2500, 50, 100, "--v=1"))
	require.Equal(t, []string{"--v=1", "--kube-api-qps=100", "--kube-api-burst=150"}, withAPIRate(5000, 50, 100, "--v=1"))
}
