package machine

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/cosi-project/runtime/pkg/safe"
	"github.com/cosi-project/runtime/pkg/state"
	machineapi "github.com/siderolabs/talos/pkg/machinery/api/machine"
	"github.com/siderolabs/talos/pkg/machinery/resources/v1alpha1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// The machine's Talos services, as machined's service runner keeps them.
//
// A service moves through Talos' states (Starting, Waiting, Preparing,
// Running, Stopping, Finished); each move is an event in its history (the
// last 64, as ServiceList shows them). Its health is unknown until the first
// health check passes, a check that Talos runs an initial delay after the
// start (1s; the kubelet 2s, etcd 5s); a stop makes it unhealthy ("service
// not running"), so a service that starts again is running and unhealthy
// until its next check passes.
//
// The Service resource (runtime namespace, Services.v1alpha1.talos.dev) is
// written from those events as Talos' ServiceController does: a Running
// event creates or updates it (Running, Healthy, Unknown from the health of
// the moment), any other event destroys it. So a restart is seen by a
// watcher as Destroyed, then Created running and not yet healthy, then
// Updated healthy: what talosctl upgrade-k8s waits for after it patched a
// kubelet.

// Service states, as Talos names them.
const (
	svcStarting  = "Starting"
	svcWaiting   = "Waiting"
	svcPreparing = "Preparing"
	svcRunning   = "Running"
	svcStopping  = "Stopping"
	svcFinished  = "Finished"
)

// maxServiceEvents is how many events Talos keeps per service.
const maxServiceEvents = 64

// serviceSpec describes one Talos service.
type serviceSpec struct {
	id string
	// initialDelay is how long after a start its first health check passes
	// (Talos' health settings); 0 for a service without health checks.
	initialDelay time.Duration
	// waitsFor is what a start waits for, as its Waiting event says.
	waitsFor string
	// container names the runner's task (a goroutine of machined otherwise).
	container bool
	// apiRestart tells whether ServiceRestart/ServiceStart may act on it.
	apiRestart bool
}

// serviceSpecs are the services of a control plane (all) or of a worker
// (neither etcd nor trustd), in the order a boot starts them.
func serviceSpecs(controlPlane bool) []serviceSpec {
	specs := []serviceSpec{
		{id: "machined", initialDelay: time.Second},
		{id: "containerd", initialDelay: time.Second, container: true},
		{id: "udevd", initialDelay: time.Second, container: true},
		{id: "syslogd", initialDelay: time.Second},
		{id: "apid", initialDelay: time.Second, waitsFor: `service "containerd" to be "up", api certificates, network`, container: true},
		{id: "auditd", initialDelay: time.Second},
		{id: "dashboard", container: true},
		{id: "cri", initialDelay: time.Second, waitsFor: "network, etc files", container: true},
	}
	if controlPlane {
		specs = append(specs,
			serviceSpec{id: "trustd", initialDelay: time.Second, waitsFor: `service "containerd" to be "up", time sync, network`, container: true},
			serviceSpec{id: "etcd", initialDelay: 5 * time.Second, waitsFor: `service "cri" to be "up", etcd spec`, container: true},
		)
	}
	return append(specs, serviceSpec{
		id: "kubelet", initialDelay: 2 * time.Second, waitsFor: `service "cri" to be "up", time sync, network, nodename`,
		container: true, apiRestart: true,
	})
}

// serviceRunner is one service's state, guarded by Machine.svcMu.
type serviceRunner struct {
	spec    serviceSpec
	state   string
	healthy *bool // nil: unknown
	message string
	change  time.Time
	events  []*machineapi.ServiceEvent
	pid     int
	// run counts the starts: a health check of an earlier run does nothing.
	run uint64
}

func (r *serviceRunner) info() *machineapi.ServiceInfo {
	h := &machineapi.ServiceHealth{Unknown: r.healthy == nil, Healthy: r.healthy != nil && *r.healthy, LastMessage: r.message}
	if !r.change.IsZero() {
		h.LastChange = timestamppb.New(r.change)
	}
	return &machineapi.ServiceInfo{
		Id:     r.spec.id,
		State:  r.state,
		Events: &machineapi.ServiceEvents{Events: slices.Clone(r.events)},
		Health: h,
	}
}

func (r *serviceRunner) push(state, msg string) {
	r.state = state
	r.events = append(r.events, &machineapi.ServiceEvent{Msg: msg, State: state, Ts: timestamppb.Now()})
	if len(r.events) > maxServiceEvents {
		r.events = r.events[len(r.events)-maxServiceEvents:]
	}
}

func (r *serviceRunner) setHealth(healthy bool, msg string) {
	if r.healthy == nil || *r.healthy != healthy {
		r.change = time.Now()
	}
	r.healthy, r.message = &healthy, msg
}

// newServices returns the machine's services, none started yet.
func newServices(controlPlane bool) map[string]*serviceRunner {
	out := map[string]*serviceRunner{}
	for _, s := range serviceSpecs(controlPlane) {
		out[s.id] = &serviceRunner{spec: s, state: "Initialized", message: "Unknown"}
	}
	return out
}

// writeService writes a service's resource as Talos' ServiceController does
// for its current state. The caller holds svcMu.
func (m *Machine) writeService(ctx context.Context, r *serviceRunner) error {
	if r.state != svcRunning {
		if err := m.cosi.Destroy(ctx, v1alpha1.NewService(r.spec.id).Metadata()); err != nil && !state.IsNotFoundError(err) {
			return fmt.Errorf("service %s: %w", r.spec.id, err)
		}
		return nil
	}
	if err := safe.StateModify(ctx, m.cosi, v1alpha1.NewService(r.spec.id), func(s *v1alpha1.Service) error {
		*s.TypedSpec() = v1alpha1.ServiceSpec{Running: true, Healthy: r.healthy != nil && *r.healthy, Unknown: r.healthy == nil}
		return nil
	}); err != nil {
		return fmt.Errorf("service %s: %w", r.spec.id, err)
	}
	return nil
}

// startService runs a service's start (Starting, Waiting, Preparing,
// Running) and schedules its first health check. The caller holds svcMu.
func (m *Machine) startService(ctx context.Context, r *serviceRunner) error {
	r.run++
	r.pid = 1200 + int(r.run)
	r.push(svcStarting, "Starting service")
	if r.spec.waitsFor != "" {
		r.push(svcWaiting, "Waiting for "+r.spec.waitsFor)
	}
	r.push(svcPreparing, "Running pre state")
	r.push(svcPreparing, "Creating service runner")
	if r.spec.container {
		r.push(svcRunning, fmt.Sprintf("Started task %s (PID %d) for container %s", r.spec.id, r.pid, r.spec.id))
	} else {
		r.push(svcRunning, "Service started as goroutine")
	}
	if err := m.writeService(ctx, r); err != nil {
		return err
	}
	if r.spec.initialDelay == 0 {
		return nil
	}
	delay := r.spec.initialDelay
	if m.opts.HealthCheckDelay > 0 {
		delay = m.opts.HealthCheckDelay
	}
	run, id := r.run, r.spec.id
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		select {
		case <-time.After(delay):
		case <-m.ctx.Done():
			return
		}
		m.svcMu.Lock()
		defer m.svcMu.Unlock()
		r := m.services[id]
		if r.run != run || r.state != svcRunning {
			return
		}
		r.setHealth(true, "Health check successful")
		if err := m.writeService(m.ctx, r); err != nil {
			m.log.Error("service health", "err", err)
		}
		m.serviceChanged(m.ctx)
	}()
	return nil
}

// stopService stops a running service (Stopping, Finished): its resource is
// destroyed. The caller holds svcMu.
func (m *Machine) stopService(ctx context.Context, r *serviceRunner) error {
	if r.state != svcRunning {
		return nil
	}
	if r.spec.container {
		r.push(svcStopping, fmt.Sprintf("Sending SIGTERM to task %s (PID %d, container %s)", r.spec.id, r.pid, r.spec.id))
	} else {
		r.push(svcStopping, "Stopping service")
	}
	if r.spec.initialDelay > 0 {
		r.setHealth(false, "service not running")
	}
	if err := m.writeService(ctx, r); err != nil {
		return err
	}
	r.push(svcFinished, "Service finished successfully")
	return nil
}

// startServices starts every service, as a boot does.
func (m *Machine) startServices(ctx context.Context) error {
	m.svcMu.Lock()
	defer m.svcMu.Unlock()
	for _, s := range serviceSpecs(m.opts.ControlPlane) {
		if err := m.startService(ctx, m.services[s.id]); err != nil {
			return err
		}
	}
	m.serviceChanged(ctx)
	return nil
}

// stopServices stops every running service, as a shutdown does: the kubelet
// first, machined and apid last.
func (m *Machine) stopServices(ctx context.Context) error {
	m.svcMu.Lock()
	defer m.svcMu.Unlock()
	specs := serviceSpecs(m.opts.ControlPlane)
	slices.Reverse(specs)
	for _, s := range specs {
		if err := m.stopService(ctx, m.services[s.id]); err != nil {
			return err
		}
	}
	m.serviceChanged(ctx)
	return nil
}

// restartService stops a service at once and starts it again after downFor,
// in the background, as Talos restarts the kubelet for a new spec. A reboot
// meanwhile cancels the start (the boot starts every service anyway).
func (m *Machine) restartService(id string, downFor time.Duration) {
	m.svcMu.Lock()
	r := m.services[id]
	if err := m.stopService(m.ctx, r); err != nil {
		m.log.Error("stop service", "service", id, "err", err)
	}
	r.run++ // a start queued by an earlier restart is superseded
	run := r.run
	m.serviceChanged(m.ctx)
	m.svcMu.Unlock()
	bootID := m.State().BootID
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		select {
		case <-time.After(downFor):
		case <-m.ctx.Done():
			return
		}
		m.svcMu.Lock()
		defer m.svcMu.Unlock()
		if s := m.State(); !s.Up || s.BootID != bootID || r.run != run || r.state == svcRunning {
			return
		}
		if err := m.startService(m.ctx, r); err != nil {
			m.log.Error("start service", "service", id, "err", err)
		}
		m.serviceChanged(m.ctx)
	}()
}

// serviceChanged records what depends on the services (the kubelet's
// running state, the machine's readiness) and notifies subscribers. The
// caller holds svcMu.
func (m *Machine) serviceChanged(ctx context.Context) {
	kubelet := m.services["kubelet"]
	running := kubelet.state == svcRunning
	m.mu.Lock()
	changed := m.st.KubeletRunning != running
	m.st.KubeletRunning = running
	m.mu.Unlock()
	if changed && !running {
		m.kubeletStopped(ctx)
	}
	m.updateStatus(ctx)
	m.notify()
}

// Services lists the machine's services as MachineService.ServiceList
// does, sorted by ID.
func (m *Machine) Services() ([]*machineapi.ServiceInfo, error) {
	if !m.isUp() {
		return nil, m.errDown()
	}
	m.svcMu.Lock()
	defer m.svcMu.Unlock()
	out := make([]*machineapi.ServiceInfo, 0, len(m.services))
	for _, r := range m.services {
		out = append(out, r.info())
	}
	slices.SortFunc(out, func(a, b *machineapi.ServiceInfo) int {
		switch {
		case a.GetId() < b.GetId():
			return -1
		case a.GetId() > b.GetId():
			return 1
		}
		return 0
	})
	return out, nil
}

// ServiceAction is MachineService.ServiceStart, ServiceStop or
// ServiceRestart, as Talos allows them from the API: the kubelet may be
// started and restarted, not stopped; every other service refuses all
// three ("service %q doesn't support ... operation via API"). An unknown
// service answers "service %q not defined". A restart (or a start of a
// service not running) takes the kubelet restart time before the service
// runs again; the call returns once the service was stopped.
func (m *Machine) ServiceAction(_ context.Context, id, action string) error {
	if !m.isUp() {
		return m.errDown()
	}
	m.svcMu.Lock()
	r, ok := m.services[id]
	if !ok {
		m.svcMu.Unlock()
		return status.Errorf(codes.Unknown, "service %q not defined", id)
	}
	running := r.state == svcRunning
	m.svcMu.Unlock()
	switch {
	case action == "stop" && !running, action == "start" && running:
		return nil
	case action == "stop", !r.spec.apiRestart:
		return status.Errorf(codes.Unknown, "service %q doesn't support %s operation via API", id, action)
	}
	m.restartService(id, m.opts.KubeletRestart)
	return nil
}
