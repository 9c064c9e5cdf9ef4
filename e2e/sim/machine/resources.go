package machine

import (
	"context"
	"fmt"
	"hash/fnv"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/cosi-project/runtime/pkg/resource"
	"github.com/cosi-project/runtime/pkg/safe"
	"github.com/cosi-project/runtime/pkg/state"
	"github.com/siderolabs/talos/pkg/machinery/config"
	"github.com/siderolabs/talos/pkg/machinery/constants"
	configres "github.com/siderolabs/talos/pkg/machinery/resources/config"
	"github.com/siderolabs/talos/pkg/machinery/resources/etcd"
	"github.com/siderolabs/talos/pkg/machinery/resources/k8s"
)

// putMachineConfig writes the MachineConfig resource id (config.ActiveID or
// config.PersistentID) holding cfg, bumping its version.
func (m *Machine) putMachineConfig(ctx context.Context, id resource.ID, cfg config.Provider) error {
	r := configres.NewMachineConfigWithID(cfg, id)
	cur, err := m.cosi.Get(ctx, r.Metadata())
	switch {
	case state.IsNotFoundError(err):
		if err := m.cosi.Create(ctx, r); err != nil {
			return fmt.Errorf("create MachineConfig %s: %w", id, err)
		}
		return nil
	case err != nil:
		return fmt.Errorf("get MachineConfig %s: %w", id, err)
	}
	r.Metadata().SetVersion(cur.Metadata().Version())
	if err := m.cosi.Update(ctx, r); err != nil {
		return fmt.Errorf("update MachineConfig %s: %w", id, err)
	}
	return nil
}

// syncConfig writes the MachineConfigs and every resource Talos derives from
// the active config, and records the derived images in the machine state.
func (m *Machine) syncConfig(ctx context.Context, active, persistent config.Provider) error {
	if err := m.putMachineConfig(ctx, configres.ActiveID, active); err != nil {
		return err
	}
	if err := m.putMachineConfig(ctx, configres.PersistentID, persistent); err != nil {
		return err
	}
	if err := safe.StateModify(ctx, m.cosi, k8s.NewNodename(k8s.NamespaceName, k8s.NodenameID), func(r *k8s.Nodename) error {
		r.TypedSpec().Nodename = m.opts.Name
		r.TypedSpec().HostnameVersion = "1"
		r.TypedSpec().SkipNodeRegistration = skipNodeRegistration(active)
		return nil
	}); err != nil {
		return fmt.Errorf("nodename: %w", err)
	}
	kubeletImage := kubeletImage(active)
	if err := safe.StateModify(ctx, m.cosi, k8s.NewKubeletSpec(k8s.NamespaceName, k8s.KubeletID), func(r *k8s.KubeletSpec) error {
		r.TypedSpec().Image = kubeletImage
		r.TypedSpec().ExpectedNodename = m.opts.Name
		r.TypedSpec().Args = kubeletArgs(active, m.opts.Name)
		return nil
	}); err != nil {
		return fmt.Errorf("kubelet spec: %w", err)
	}

	pods := map[string]StaticPod{}
	if m.opts.ControlPlane {
		if err := safe.StateModify(ctx, m.cosi, etcd.NewMember(etcd.NamespaceName, etcd.LocalMemberID), func(r *etcd.Member) error {
			r.TypedSpec().MemberID = fmt.Sprintf("%016x", EtcdMemberID(m.opts.Name))
			return nil
		}); err != nil {
			return fmt.Errorf("etcd member: %w", err)
		}
		var err error
		if pods, err = m.syncControlPlane(ctx, active); err != nil {
			return err
		}
		if err := m.renderManifestsLater(ctx, active); err != nil {
			return err
		}
	}
	proxyImage := proxyImage(active)
	m.mu.Lock()
	m.st.StaticPods = pods
	m.st.KubeletImage = kubeletImage
	m.st.ProxyImage = proxyImage
	m.mu.Unlock()
	return nil
}

func kubeletArgs(cfg config.Config, nodeName string) []string {
	args := []string{
		"--config=/etc/kubernetes/kubelet.yaml",
		"--kubeconfig=/etc/kubernetes/kubeconfig-kubelet",
		"--cert-dir=/var/lib/kubelet/pki",
		"--hostname-override=" + nodeName,
	}
	return append(args, flattenArgs(kubeletExtraArgs(cfg))...)
}

func flattenArgs(extra map[string][]string) []string {
	var out []string
	for k, vs := range extra {
		for _, v := range vs {
			out = append(out, fmt.Sprintf("--%s=%s", k, v))
		}
	}
	slices.Sort(out)
	return out
}

func argValues(extra map[string][]string) map[string]k8s.ArgValues {
	out := make(map[string]k8s.ArgValues, len(extra))
	for k, v := range extra {
		out[k] = k8s.ArgValues{Values: slices.Clone(v)}
	}
	return out
}

// syncControlPlane writes the controlplane config resources and the static
// pods they produce, the pods annotated with the config resource's version.
func (m *Machine) syncControlPlane(ctx context.Context, cfg config.Config) (map[string]StaticPod, error) {
	apiServer, controllerManager, scheduler := cfg.K8sAPIServerConfig(), cfg.K8sControllerManagerConfig(), cfg.K8sSchedulerConfig()
	net := clusterNetwork(cfg)
	api, err := safe.StateModifyWithResult(ctx, m.cosi, k8s.NewAPIServerConfig(k8s.APIServerConfigID), func(r *k8s.APIServerConfig) error {
		s := r.TypedSpec()
		s.Image = apiServer.Image()
		s.ControlPlaneEndpoint = clusterEndpoint(cfg)
		s.EtcdServers = []string{"https://localhost:2379"}
		s.LocalPort = apiServerPort(cfg)
		s.ServiceCIDRs = net.ServiceCIDRs
		s.ExtraArgs = argValues(apiServer.ExtraArgs())
		s.AdvertisedAddress = "$(POD_IP)"
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("APIServerConfig: %w", err)
	}
	cm, err := safe.StateModifyWithResult(ctx, m.cosi, k8s.NewControllerManagerConfig(k8s.ControllerManagerConfigID), func(r *k8s.ControllerManagerConfig) error {
		s := r.TypedSpec()
		s.Enabled = true
		s.Image = controllerManager.Image()
		s.PodCIDRs = net.PodCIDRs
		s.ServiceCIDRs = net.ServiceCIDRs
		s.ExtraArgs = argValues(controllerManager.ExtraArgs())
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("ControllerManagerConfig: %w", err)
	}
	sched, err := safe.StateModifyWithResult(ctx, m.cosi, k8s.NewSchedulerConfig(k8s.SchedulerConfigID), func(r *k8s.SchedulerConfig) error {
		s := r.TypedSpec()
		s.Enabled = true
		s.Image = scheduler.Image()
		s.ExtraArgs = argValues(scheduler.ExtraArgs())
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("SchedulerConfig: %w", err)
	}

	if talosMinor(m.State().TalosVersion) >= 14 {
		// Talos 1.14 renders each static pod from a "final-" config resource
		// that its controllers derive from the first (with the full
		// arguments), and annotates the pod with that one's version, a
		// counter of its own (here it moves with the first one).
		if api, err = safe.StateModifyWithResult(ctx, m.cosi, k8s.NewAPIServerConfig(k8s.FinalAPIServerConfigID), func(r *k8s.APIServerConfig) error {
			*r.TypedSpec() = *api.TypedSpec()
			return nil
		}); err != nil {
			return nil, fmt.Errorf("final APIServerConfig: %w", err)
		}
		if cm, err = safe.StateModifyWithResult(ctx, m.cosi, k8s.NewControllerManagerConfig(k8s.FinalControllerManagerConfigID), func(r *k8s.ControllerManagerConfig) error {
			*r.TypedSpec() = *cm.TypedSpec()
			return nil
		}); err != nil {
			return nil, fmt.Errorf("final ControllerManagerConfig: %w", err)
		}
		if sched, err = safe.StateModifyWithResult(ctx, m.cosi, k8s.NewSchedulerConfig(k8s.FinalSchedulerConfigID), func(r *k8s.SchedulerConfig) error {
			*r.TypedSpec() = *sched.TypedSpec()
			return nil
		}); err != nil {
			return nil, fmt.Errorf("final SchedulerConfig: %w", err)
		}
	}
	pods := map[string]StaticPod{
		k8s.APIServerID: {Image: api.TypedSpec().Image, ConfigVersion: api.Metadata().Version().String()},
		k8s.ControllerManagerID: {
			Image: cm.TypedSpec().Image, ConfigVersion: cm.Metadata().Version().String(),
		},
		k8s.SchedulerID: {Image: sched.TypedSpec().Image, ConfigVersion: sched.Metadata().Version().String()},
	}
	commands := map[string][]string{
		k8s.APIServerID: append([]string{
			"/usr/local/bin/kube-apiserver",
			"--etcd-servers=https://localhost:2379",
			"--secure-port=" + strconv.Itoa(apiServerPort(cfg)),
			"--service-cluster-ip-range=" + strings.Join(net.ServiceCIDRs, ","),
		}, flattenArgs(apiServer.ExtraArgs())...),
		k8s.ControllerManagerID: append([]string{
			"/usr/local/bin/kube-controller-manager",
			"--use-service-account-credentials",
			"--cluster-cidr=" + strings.Join(net.PodCIDRs, ","),
			"--service-cluster-ip-range=" + strings.Join(net.ServiceCIDRs, ","),
		}, flattenArgs(controllerManager.ExtraArgs())...),
		k8s.SchedulerID: append([]string{
			"/usr/local/bin/kube-scheduler",
			"--config=/system/config/kube-scheduler/scheduler-config.yaml",
		}, flattenArgs(scheduler.ExtraArgs())...),
	}
	for id, p := range pods {
		pod := staticPodObject(id, p, commands[id])
		if err := safe.StateModify(ctx, m.cosi, k8s.NewStaticPod(k8s.NamespaceName, id), func(r *k8s.StaticPod) error {
			r.TypedSpec().Pod = pod
			return nil
		}); err != nil {
			return nil, fmt.Errorf("static pod %s: %w", id, err)
		}
	}
	return pods, nil
}

// staticPodObject renders a control-plane static pod the way Talos does:
// labels tier=control-plane and k8s-app, annotation talos.dev/config-version.
func staticPodObject(id string, p StaticPod, command []string) map[string]any {
	cmd := make([]any, len(command))
	for i, c := range command {
		cmd[i] = c
	}
	return map[string]any{
		"apiVersion": "v1",
		"kind":       "Pod",
		"metadata": map[string]any{
			"name":      id,
			"namespace": "kube-system",
			"annotations": map[string]any{
				constants.AnnotationStaticPodConfigVersion:  p.ConfigVersion,
				constants.AnnotationStaticPodSecretsVersion: "1",
			},
			"labels": map[string]any{
				"tier":                         "control-plane",
				"k8s-app":                      id,
				"component":                    id,
				"app.kubernetes.io/name":       id,
				"app.kubernetes.io/version":    strings.TrimPrefix(imageTag(p.Image), "v"),
				"app.kubernetes.io/component":  "control-plane",
				"app.kubernetes.io/managed-by": "Talos",
			},
		},
		"spec": map[string]any{
			"priorityClassName": "system-cluster-critical",
			"hostNetwork":       true,
			"containers": []any{
				map[string]any{
					"name":    id,
					"image":   p.Image,
					"command": cmd,
				},
			},
		},
	}
}

// imageTag returns the tag of an image reference ("" without one).
func imageTag(image string) string {
	ref := image
	if i := strings.Index(ref, "@"); i >= 0 {
		ref = ref[:i]
	}
	i := strings.LastIndex(ref, ":")
	if i < 0 || i < strings.LastIndex(ref, "/") {
		return ""
	}
	return ref[i+1:]
}

// renderManifestsLater renders the bootstrap manifests for cfg: at once on a boot's
// first render, else ManifestRenderDelay later (Talos' controllers re-render them
// asynchronously after a config change); a later render supersedes an earlier one
// not yet done.
func (m *Machine) renderManifestsLater(ctx context.Context, cfg config.Config) error {
	st := m.cosi

	if _, err := st.Get(ctx, k8s.NewManifestStatus(k8s.ControlPlaneNamespaceName).Metadata()); state.IsNotFoundError(err) {
		return m.syncManifests(ctx, st, cfg)
	}

	m.mu.Lock()
	m.manifestGen++
	gen := m.manifestGen
	m.mu.Unlock()

	m.wg.Add(1)

	go func() {
		defer m.wg.Done()

		select {
		case <-m.ctx.Done():
			return
		case <-time.After(m.opts.ManifestRenderDelay):
		}

		m.mu.Lock()
		latest := gen == m.manifestGen
		m.mu.Unlock()

		if !latest {
			return
		}

		if err := m.syncManifests(m.ctx, st, cfg); err != nil {
			m.log.Warn("render bootstrap manifests", "err", err)
		}
	}()

	return nil
}

// syncManifests writes the bootstrap Manifest resources (removing those the
// config no longer renders, keeping those whose URL could not be fetched) and
// the ManifestStatus listing them as applied.
func (m *Machine) syncManifests(ctx context.Context, st state.State, cfg config.Config) error {
	ids, objects, failed, err := renderManifests(cfg, fetchManifest)
	if err != nil {
		return err
	}
	for id, err := range failed {
		m.log.Warn("render bootstrap manifests: kept the last render", "manifest", id, "err", err)
	}
	for _, id := range ids {
		items := make([]k8s.SingleManifest, 0, len(objects[id]))
		for _, o := range objects[id] {
			items = append(items, k8s.SingleManifest{Object: o})
		}
		if err := safe.StateModify(ctx, st, k8s.NewManifest(k8s.ControlPlaneNamespaceName, id), func(r *k8s.Manifest) error {
			r.TypedSpec().Items = items
			return nil
		}); err != nil {
			return fmt.Errorf("manifest %s: %w", id, err)
		}
	}
	existing, err := safe.StateListAll[*k8s.Manifest](ctx, st)
	if err != nil {
		return fmt.Errorf("list manifests: %w", err)
	}
	for r := range existing.All() {
		if _, kept := failed[r.Metadata().ID()]; !kept && !slices.Contains(ids, r.Metadata().ID()) {
			if err := st.Destroy(ctx, r.Metadata()); err != nil {
				return fmt.Errorf("remove manifest %s: %w", r.Metadata().ID(), err)
			}
		}
	}
	if err := safe.StateModify(ctx, st, k8s.NewManifestStatus(k8s.ControlPlaneNamespaceName), func(r *k8s.ManifestStatus) error {
		r.TypedSpec().ManifestsApplied = slices.Clone(ids)
		return nil
	}); err != nil {
		return fmt.Errorf("manifest status: %w", err)
	}
	return nil
}

// EtcdMemberID is the etcd member ID of a control plane, by its name: the
// same in EtcdMemberList and in its EtcdMember resource (which Talos
// writes as 16 hex digits).
func EtcdMemberID(name string) uint64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte(name))
	return h.Sum64()
}

// kubeletSpecVersion returns the version of the KubeletSpec resource ("" if
// there is none).
func (m *Machine) kubeletSpecVersion(ctx context.Context) string {
	r, err := safe.StateGetByID[*k8s.KubeletSpec](ctx, m.cosi, k8s.KubeletID)
	if err != nil {
		return ""
	}
	return r.Metadata().Version().String()
}
