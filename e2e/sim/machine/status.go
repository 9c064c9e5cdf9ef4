package machine

import (
	"context"
	"fmt"
	"maps"
	"strings"
	"time"

	"github.com/cosi-project/runtime/pkg/safe"
	"github.com/cosi-project/runtime/pkg/state"
	"github.com/siderolabs/talos/pkg/machinery/resources/k8s"
	"github.com/siderolabs/talos/pkg/machinery/resources/runtime"
	"github.com/siderolabs/talos/pkg/machinery/resources/v1alpha1"
	"google.golang.org/protobuf/proto"
)

// DefaultStaticPodStatusInterval is how often Talos refreshes the
// StaticPodStatus resources from its kubelet's pod list.
const DefaultStaticPodStatusInterval = 15 * time.Second

// KubeletView is what Talos learns from the kubelet it runs and from the
// Kubernetes API: the simulated kubelet reports it (see package kubelet)
// whenever it changes.
type KubeletView struct {
	// NodeReady is the Node's Ready condition and Unschedulable its
	// spec.unschedulable, as Talos' NodeStatus controller watches them.
	NodeReady, Unschedulable bool
	// StaticPods are the static pods the kubelet runs, by
	// "namespace/name", each with its status as the kubelet's /pods endpoint
	// serves it (a PodStatus as a JSON object).
	StaticPods map[string]map[string]any
}

// ObserveKubelet records what the machine's kubelet and the Node show now.
// The NodeStatus resource follows at once (Talos watches the Node); the
// StaticPodStatus resources at the next refresh (Talos polls its kubelet
// every 15 seconds, and only on control planes, whose apiserver client
// certificate can read the kubelet's pods).
func (m *Machine) ObserveKubelet(v KubeletView) {
	v.StaticPods = maps.Clone(v.StaticPods)
	m.mu.Lock()
	m.kubelet = v
	up := m.st.Up
	m.mu.Unlock()
	if !up {
		return
	}
	if err := safe.StateModify(m.ctx, m.cosi, k8s.NewNodeStatus(k8s.NamespaceName, m.opts.Name), func(r *k8s.NodeStatus) error {
		r.TypedSpec().Nodename = m.opts.Name
		r.TypedSpec().NodeReady = v.NodeReady
		r.TypedSpec().Unschedulable = v.Unschedulable
		return nil
	}); err != nil {
		m.log.Error("node status", "err", err)
	}
	m.updateStatus(m.ctx)
}

// refreshStaticPodStatuses writes the StaticPodStatus resources from the
// kubelet's pod list, every StaticPodStatusInterval while the kubelet runs,
// until the machine is closed.
func (m *Machine) refreshStaticPodStatuses() {
	interval := m.opts.StaticPodStatusInterval
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		select {
		case <-m.ctx.Done():
			return
		case <-tick.C:
		}
		if !m.opts.ControlPlane {
			continue
		}
		m.svcMu.Lock()
		running := m.services["kubelet"].state == svcRunning
		m.mu.Lock()
		pods, up := maps.Clone(m.kubelet.StaticPods), m.st.Up
		m.mu.Unlock()
		if running && up {
			if err := m.writeStaticPodStatuses(m.ctx, pods); err != nil {
				m.log.Error("static pod status", "err", err)
			}
		}
		m.svcMu.Unlock()
		m.updateStatus(m.ctx)
	}
}

func (m *Machine) writeStaticPodStatuses(ctx context.Context, pods map[string]map[string]any) error {
	for id, st := range pods {
		if err := safe.StateModify(ctx, m.cosi, k8s.NewStaticPodStatus(k8s.NamespaceName, id), func(r *k8s.StaticPodStatus) error {
			r.TypedSpec().PodStatus = st
			return nil
		}); err != nil {
			return fmt.Errorf("%s: %w", id, err)
		}
	}
	list, err := safe.StateListAll[*k8s.StaticPodStatus](ctx, m.cosi)
	if err != nil {
		return err
	}
	for r := range list.All() {
		if _, ok := pods[r.Metadata().ID()]; !ok {
			if err := m.cosi.Destroy(ctx, r.Metadata()); err != nil && !state.IsNotFoundError(err) {
				return err
			}
		}
	}
	return nil
}

// kubeletStopped tears the StaticPodStatus resources down, as Talos does
// when its kubelet Service goes away. The caller holds svcMu.
func (m *Machine) kubeletStopped(ctx context.Context) {
	if err := m.writeStaticPodStatuses(ctx, nil); err != nil {
		m.log.Error("static pod status teardown", "err", err)
	}
}

// setStage records the machine's stage and writes its MachineStatus.
func (m *Machine) setStage(ctx context.Context, stage runtime.MachineStage) {
	m.mu.Lock()
	m.stage = stage
	m.mu.Unlock()
	m.updateStatus(ctx)
}

// updateStatus writes the MachineStatus as Talos' MachineStatusController
// does: the stage, and while booting or running the readiness checks
// (time and network, always met here; services; static pods; the Node
// Ready). In any other stage (rebooting, upgrading, ...) Talos runs no
// check, so the machine reports itself ready.
func (m *Machine) updateStatus(ctx context.Context) {
	m.statusMu.Lock()
	defer m.statusMu.Unlock()
	m.mu.Lock()
	stage := m.stage
	m.mu.Unlock()
	var unmet []runtime.UnmetCondition
	if stage == runtime.MachineStageBooting || stage == runtime.MachineStageRunning {
		for _, check := range []struct {
			name string
			f    func(context.Context) error
		}{
			{"services", m.servicesCheck},
			{"staticPods", m.staticPodsCheck},
			{"nodeReady", m.nodeReadyCheck},
		} {
			if err := check.f(ctx); err != nil {
				unmet = append(unmet, runtime.UnmetCondition{Name: check.name, Reason: err.Error()})
			}
		}
	}
	if err := safe.StateModify(ctx, m.cosi, runtime.NewMachineStatus(), func(r *runtime.MachineStatus) error {
		r.TypedSpec().Stage = stage
		r.TypedSpec().Status.Ready = len(unmet) == 0
		r.TypedSpec().Status.UnmetConditions = unmet
		return nil
	}); err != nil {
		m.log.Error("machine status", "err", err)
		return
	}
	// Talos' MachineStatusPublisher publishes each change as an event.
	ev := statusEvent(stage, len(unmet) == 0, unmet)
	m.mu.Lock()
	changed := m.lastStatus == nil || !proto.Equal(m.lastStatus, ev)
	if changed {
		m.lastStatus = ev
	}
	m.mu.Unlock()
	if changed {
		m.publish("", ev)
	}
}

func (m *Machine) servicesCheck(ctx context.Context) error {
	list, err := safe.StateListAll[*v1alpha1.Service](ctx, m.cosi)
	if err != nil {
		return err
	}
	var problems []string
	running := map[string]bool{}
	for s := range list.All() {
		id, spec := s.Metadata().ID(), s.TypedSpec()
		if !spec.Running {
			problems = append(problems, id+" not running")
			continue
		}
		running[id] = true
		if !spec.Unknown && !spec.Healthy {
			problems = append(problems, id+" not healthy")
		}
	}
	required := []string{"apid", "machined", "kubelet"}
	if m.opts.ControlPlane {
		required = append(required, "etcd", "trustd")
	}
	for _, id := range required {
		if !running[id] {
			problems = append(problems, id+" not running")
		}
	}
	if len(problems) > 0 {
		return fmt.Errorf("%s", strings.Join(problems, ", "))
	}
	return nil
}

func (m *Machine) staticPodsCheck(ctx context.Context) error {
	list, err := safe.StateListAll[*k8s.StaticPodStatus](ctx, m.cosi)
	if err != nil {
		return err
	}
	var problems []string
	for r := range list.All() {
		phase, _ := r.TypedSpec().PodStatus["phase"].(string)
		switch phase {
		case "Succeeded":
		case "Running":
			if !podReady(r.TypedSpec().PodStatus) {
				problems = append(problems, r.Metadata().ID()+" not ready")
			}
		default:
			problems = append(problems, r.Metadata().ID()+" "+strings.ToLower(phase))
		}
	}
	if len(problems) > 0 {
		return fmt.Errorf("%s", strings.Join(problems, ", "))
	}
	return nil
}

// podReady reads the Ready condition of a PodStatus object.
func podReady(st map[string]any) bool {
	conds, _ := st["conditions"].([]any)
	for _, c := range conds {
		cm, _ := c.(map[string]any)
		if cm["type"] == "Ready" {
			return cm["status"] == "True"
		}
	}
	return false
}

func (m *Machine) nodeReadyCheck(ctx context.Context) error {
	nodename, err := safe.StateGetByID[*k8s.Nodename](ctx, m.cosi, k8s.NodenameID)
	if err != nil {
		if state.IsNotFoundError(err) {
			return nil
		}
		return err
	}
	if nodename.TypedSpec().SkipNodeRegistration {
		return nil
	}
	name := nodename.TypedSpec().Nodename
	ns, err := safe.StateGetByID[*k8s.NodeStatus](ctx, m.cosi, name)
	if err != nil {
		if state.IsNotFoundError(err) {
			return fmt.Errorf("node %q status is not available yet", name)
		}
		return err
	}
	if !ns.TypedSpec().NodeReady {
		return fmt.Errorf("node %q is not ready", name)
	}
	return nil
}
