// Package cluster runs a local simulated Talos cluster: the real control-plane
// processes, the simulated Talos machines and their API, and the simulated
// kubelets, all under one daemon whose state lives in a directory.
package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/runtime"

	"github.com/ichor-dev/kubectl-ichor/e2e/sim/events"
	"github.com/ichor-dev/kubectl-ichor/e2e/sim/faults"
	"github.com/ichor-dev/kubectl-ichor/e2e/sim/kubelet"
	"github.com/ichor-dev/kubectl-ichor/e2e/sim/machine"
	simmanifests "github.com/ichor-dev/kubectl-ichor/e2e/sim/manifests"
	"github.com/ichor-dev/kubectl-ichor/e2e/sim/talosaccess"
	"github.com/ichor-dev/kubectl-ichor/e2e/sim/talosapi"
)

// Files in a cluster's directory.
const (
	KubeconfigFile  = "kubeconfig"
	TalosconfigFile = "talosconfig"
	EventsFile      = "events.jsonl"
	ReadyFile       = "ready.json"
	PIDFile         = "ichor-sim.pid"
	LogDir          = "logs"
)

// Info is written to ready.json once the cluster is up.
type Info struct {
	Name              string `json:"name"`
	APIServer         string `json:"apiServer"`
	KubernetesVersion string `json:"kubernetesVersion"`
	TalosVersion      string `json:"talosVersion"`
	BornOn            string `json:"bornOn"`
	// EtcdURL is the client URL (plain HTTP) of the cluster's one real etcd,
	// the raft log the simulated members report (a test writes to it to load
	// etcd as a busy cluster does).
	EtcdURL string `json:"etcdURL"`
	// Mirror is the host:port of the cluster's private registry, when it runs one.
	Mirror    string        `json:"mirror,omitempty"`
	Machines  []MachineInfo `json:"machines"`
	StartedIn string        `json:"startedIn"`
}

// MachineInfo names one machine.
type MachineInfo struct {
	Name         string `json:"name"`
	IP           string `json:"ip"`
	ControlPlane bool   `json:"controlPlane"`
}

// Run starts the cluster and serves it until ctx ends, then stops everything
// it started. ready is called once the cluster is up.
func Run(ctx context.Context, opts Options, selfExe string, log *slog.Logger, ready func(Info)) (err error) {
	start := time.Now()
	if err := opts.Validate(); err != nil {
		return err
	}
	for _, stale := range []string{"etcd", "pki", "pods", ReadyFile, EventsFile, KubeconfigFile, TalosconfigFile} {
		if err := os.RemoveAll(filepath.Join(opts.Dir, stale)); err != nil {
			return err
		}
	}
	if err := os.MkdirAll(filepath.Join(opts.Dir, LogDir, "pods"), 0o755); err != nil {
		return err
	}
	n := opts.ControlPlanes + opts.Workers
	addrs, err := pickAddresses(opts.Dir, n)
	if err != nil {
		return err
	}
	log.Info("generating machine configs", "machines", n, "addresses", fmt.Sprintf("%s/20 x %d", addrs.base, blocksFor(n)))
	var mirror *machine.Mirror
	if len(opts.Mirror) > 0 {
		mirror = &machine.Mirror{Host: net.JoinHostPort(addrs.apiServer().String(), strconv.Itoa(MirrorPort)), Releases: opts.Mirror}
	}
	g, err := generateConfigs(opts, addrs, mirror)
	if err != nil {
		return err
	}
	ev, err := events.Open(filepath.Join(opts.Dir, EventsFile))
	if err != nil {
		return err
	}
	defer ev.Close()
	fs, err := faults.Load(opts.FaultsFile)
	if err != nil {
		return err
	}
	if mirror != nil {
		mirror.Faults = fs
	}

	log.Info("starting the control plane", "apiserver", addrs.apiServer().String())
	cp, err := startControlPlane(ctx, opts, addrs, g)
	if err != nil {
		return err
	}
	defer cp.stop()
	if err := g.talosconfig.Save(filepath.Join(opts.Dir, TalosconfigFile)); err != nil {
		return fmt.Errorf("write talosconfig: %w", err)
	}
	adminKubeconfig, err := os.ReadFile(filepath.Join(opts.Dir, KubeconfigFile))
	if err != nil {
		return err
	}

	log.Info("booting the Talos machines")
	var machines []*machine.Machine
	defer func() {
		for _, m := range machines {
			m.Close()
		}
	}()
	drainer := &talosDrainer{client: cp.client, log: log}
	discovery := machine.NewDiscovery()
	// The first control plane bootstraps the cluster: it cannot start off.
	if first := g.machines[0].Name; fs.For(first).PoweredOff {
		return fmt.Errorf("faults: %s bootstraps the cluster and cannot start poweredOff: power off another machine", first)
	}
	for _, spec := range g.machines {
		m, err := machine.New(machine.Options{
			Name:                spec.Name,
			IP:                  spec.IP,
			ControlPlane:        spec.ControlPlane,
			TalosVersion:        opts.TalosVersion,
			Extensions:          opts.machineExtensions(spec.Name),
			BootedWithUKI:       opts.BootLoaders[spec.Name] == BootLoaderSystemdBoot,
			Config:              spec.Config,
			AdminKubeconfig:     adminKubeconfig,
			Events:              ev,
			Faults:              fs,
			Mirror:              mirror,
			RebootDelay:         opts.Latency.Reboot,
			PullLatency:         opts.Latency.ImagePull,
			KubeletRestart:      opts.Latency.KubeletRestart,
			Discovery:           discovery,
			StaticPodApplyWait:  opts.Latency.StaticPodRestart,
			ManifestRenderDelay: opts.Latency.ManifestRender,
			BeforeReboot:        drainer.beforeReboot(spec.Name),
			Log:                 log,
		})
		if err != nil {
			return err
		}
		machines = append(machines, m)
	}
	api, err := talosapi.Start(ctx, talosapi.Options{
		Machines: machines,
		CACert:   g.bundle.Certs.OS.Crt,
		CAKey:    g.bundle.Certs.OS.Key,
		EtcdURL:  cp.etcdURL,
		Log:      log,
	})
	if err != nil {
		return fmt.Errorf("talos API: %w", err)
	}
	defer api.Stop()

	k8sCA, err := parseCA(g.bundle.Certs.K8s.Crt, g.bundle.Certs.K8s.Key)
	if err != nil {
		return err
	}
	if mirror != nil {
		if err := serveMirror(ctx, opts.Dir, mirror, k8sCA, addrs.apiServer()); err != nil {
			return err
		}
		log.Info("serving the mirror", "host", mirror.Host, "releases", strings.Join(mirror.Releases, ","))
	}
	var nodeIPs []net.IP
	kms := make([]kubelet.Machine, 0, len(machines))
	for _, m := range machines {
		nodeIPs = append(nodeIPs, m.IP().AsSlice())
		kms = append(kms, machineAdapter{m})
	}
	serving, err := k8sCA.issue("kubelet", nil, nodeIPs, nil, true, false)
	if err != nil {
		return err
	}
	kctx, kcancel := context.WithCancel(ctx)
	defer kcancel()
	kubelets, err := kubelet.Start(kctx, kubelet.Options{
		Client:           cp.client,
		RestConfig:       cp.restConfig,
		Events:           ev,
		Faults:           fs,
		Log:              log,
		StaticPodRestart: opts.Latency.StaticPodRestart,
		Ready:            opts.Latency.Ready,
		PodStart:         opts.Latency.PodStart,
		Images:           opts.Images,
		PodDir:           filepath.Join(opts.Dir, "pods"),
		LogDir:           filepath.Join(opts.Dir, LogDir, "pods"),
		APIServer:        netip.AddrPortFrom(addrs.apiServer(), apiPort),
		Hosts: map[string][]string{
			"kubernetes.default.svc":               {addrs.apiServer().String()},
			"kubernetes.default.svc.cluster.local": {addrs.apiServer().String()},
			// Talos' talos.default Service has every control plane's apid
			// behind it: a client fails over while one reboots.
			"talos.default": controlPlaneIPs(machines),
		},
		ExecPod:     []string{selfExe, "exec-pod"},
		ServingCert: serving.CertPEM,
		ServingKey:  serving.KeyPEM,
		ClientCA:    k8sCA.certPEM,
	}, kms)
	if err != nil {
		return err
	}
	defer func() {
		kcancel()
		kubelets.Wait()
	}()
	for _, m := range machines {
		go drainer.uncordonAfterBoot(kctx, m)
	}
	if err := recordCordons(kctx, cp.client, ev); err != nil {
		return fmt.Errorf("record cordons: %w", err)
	}

	// The bootstrap as the Talos version the cluster was born on did it; from
	// then on each control plane's controller keeps the objects as the version
	// it runs does (Watch), as it would after Talos upgrades.
	log.Info("applying the bootstrap manifests", "as", opts.BornOn)
	manifests, err := simmanifests.NewApplier(cp.restConfig, log)
	if err != nil {
		return fmt.Errorf("bootstrap manifests: %w", err)
	}
	if err := manifests.ApplyAs(ctx, machines[0], opts.BornOn); err != nil {
		return fmt.Errorf("bootstrap manifests: %w", err)
	}
	var controlPlanes []*machine.Machine
	for _, m := range machines {
		if m.ControlPlane() {
			controlPlanes = append(controlPlanes, m)
		}
	}
	go manifests.Watch(kctx, controlPlanes)
	if opts.TalosAPIAccess {
		if err := talosaccess.Start(kctx, cp.restConfig, g.bundle, machines[0], log); err != nil {
			return fmt.Errorf("talos API access: %w", err)
		}
	}
	// A machine powered off (a fault) is not waited for: it joins when
	// switched on.
	nodes, upControlPlanes := 0, 0
	for _, m := range machines {
		if !m.State().Up {
			log.Info("not waiting for a powered-off machine", "machine", m.Name())
			continue
		}
		nodes++
		if m.ControlPlane() {
			upControlPlanes++
		}
	}
	log.Info("waiting for nodes and static pods to be Ready")
	// Thousands of nodes take longer: each Node's status, each kube-proxy
	// pod's creation, binding and start are requests to the one apiserver.
	if err := waitClusterReady(ctx, cp, nodes, upControlPlanes, max(3*time.Minute, time.Duration(nodes)*150*time.Millisecond)); err != nil {
		return err
	}
	info := Info{
		Name:              opts.Name,
		APIServer:         fmt.Sprintf("https://%s:%d", addrs.apiServer(), apiPort),
		KubernetesVersion: opts.KubernetesVersion,
		TalosVersion:      opts.TalosVersion,
		BornOn:            opts.BornOn,
		EtcdURL:           cp.etcdURL,
		StartedIn:         time.Since(start).Round(time.Millisecond).String(),
	}
	if mirror != nil {
		info.Mirror = mirror.Host
	}
	for _, m := range machines {
		info.Machines = append(info.Machines, MachineInfo{Name: m.Name(), IP: m.IP().String(), ControlPlane: m.ControlPlane()})
	}
	b, _ := json.MarshalIndent(info, "", "  ")
	if err := os.WriteFile(filepath.Join(opts.Dir, ReadyFile), b, 0o644); err != nil {
		return err
	}
	log.Info("cluster is up", "in", info.StartedIn)
	if ready != nil {
		ready(info)
	}
	ticker := time.NewTicker(time.Second)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			log.Info("stopping the cluster")
			_ = os.Remove(filepath.Join(opts.Dir, ReadyFile))
			return nil
		case <-ticker.C:
			if err := cp.followAPIServerFault(fs.APIServerDown(), log); err != nil {
				return fmt.Errorf("control plane: restart the kube-apiserver: %w", err)
			}
			if err := cp.alive(); err != nil {
				return errors.New("control plane failed: " + err.Error())
			}
		}
	}
}

// machineAdapter shows a machine to its kubelet.
type machineAdapter struct{ m *machine.Machine }

func (a machineAdapter) Name() string       { return a.m.Name() }
func (a machineAdapter) IP() netip.Addr     { return a.m.IP() }
func (a machineAdapter) ControlPlane() bool { return a.m.ControlPlane() }
func (a machineAdapter) Changes() (<-chan struct{}, func()) {
	return a.m.Subscribe()
}

func (a machineAdapter) Current() kubelet.MachineState {
	st := a.m.State()
	out := kubelet.MachineState{
		Up:             st.Up,
		PowerLost:      a.m.PoweredOff(),
		TalosVersion:   st.TalosVersion,
		BootID:         st.BootID,
		KubeletImage:   st.KubeletImage,
		KubeletRunning: st.KubeletRunning,
		StaticPods:     map[string]kubelet.StaticPod{},
	}
	for k, v := range st.StaticPods {
		out.StaticPods[k] = kubelet.StaticPod{Image: v.Image, ConfigVersion: v.ConfigVersion}
	}
	return out
}

// Observe shows the machine its kubelet's pod statuses as JSON objects, the
// form Talos keeps them in.
func (a machineAdapter) Observe(o kubelet.Observed) {
	v := machine.KubeletView{NodeReady: o.NodeReady, StaticPods: map[string]map[string]any{}}
	for id, st := range o.StaticPods {
		obj, err := runtime.DefaultUnstructuredConverter.ToUnstructured(&st)
		if err != nil {
			continue
		}
		v.StaticPods[id] = obj
	}
	a.m.ObserveKubelet(v)
}

func controlPlaneIPs(machines []*machine.Machine) []string {
	var out []string
	for _, m := range machines {
		if m.ControlPlane() {
			out = append(out, m.IP().String())
		}
	}
	return out
}
