package engine

import (
	"context"
	"errors"
	"fmt"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"

	"github.com/ichor-dev/kubectl-ichor/pkg/render"
	"github.com/ichor-dev/kubectl-ichor/pkg/stages"
	"github.com/ichor-dev/kubectl-ichor/pkg/talos"
)

// Install stages the installer's version into the other boot slot, as
// LifecycleService.Upgrade does: the machine runs on until its Reboot. A
// second Install while one runs is refused as Talos does; every Install that
// took is counted.
func (o *fakeOS) Install(ctx context.Context, ip, image string) (bool, error) {
	if _, ok := ctx.Deadline(); !ok {
		return false, errors.New("fake talos: an Install without its own deadline")
	}

	m, err := o.reachable(ctx, ip)
	if err != nil {
		return false, fmt.Errorf("node %q: upgrade: %w", ip, err)
	}

	o.mu.Lock()
	legacy := m.faults.legacy
	o.mu.Unlock()

	if legacy {
		return o.legacyUpgrade(ctx, m, ip, image)
	}

	o.mu.Lock()
	fails, breaks, hook, busy := m.faults.upgradeFails, m.faults.installBreaks, o.onUpgrade, m.installing
	hangs, takes := m.faults.installHangs, m.faults.installTakes
	if !busy {
		m.installing, m.image = true, image
	}
	o.mu.Unlock()

	if busy {
		return false, fmt.Errorf("node %q: upgrade: %w", ip, status.Error(codes.FailedPrecondition, "another installation/upgrade is already in progress"))
	}

	// The install ends here, or (installTakes) where its installer ends.
	detached := false

	defer func() {
		if detached {
			return
		}

		o.mu.Lock()
		m.installing = false
		o.mu.Unlock()
	}()

	if fails {
		o.mu.Lock()
		m.installed = talos.InstallFailed
		o.mu.Unlock()

		return false, fmt.Errorf("node %q: upgrade to %s: the installer exited with code 1", ip, image)
	}

	var after error

	if hook != nil {
		skip, err := hook(ctx, m.name)
		if skip {
			return false, fmt.Errorf("node %q: upgrade to %s: %w", ip, image, err)
		}

		after = err
	}

	cordoned := o.f.cordonedByIchor()

	install := func() {
		o.mu.Lock()
		o.upgrades = append(o.upgrades, m.name+" "+image)
		o.unavailable = append(o.unavailable, cordoned)
		m.staged, m.stagedImage = render.TagOf(image), image
		m.installed = talos.InstallDone
		m.installing = false
		o.mu.Unlock()
	}

	if takes > 0 {
		// Talos runs the installer to its end whether its caller waits or not.
		detached = true
		done := make(chan struct{})

		o.wg.Add(1)

		go func() {
			defer o.wg.Done()
			defer close(done)

			select {
			case <-o.done:
				return
			case <-time.After(takes):
			}

			install()
		}()

		select {
		case <-done:
		case <-ctx.Done():
			return false, fmt.Errorf("node %q: upgrade to %s: %w", ip, image, status.FromContextError(ctx.Err()).Err())
		}
	} else {
		install()
	}

	if hangs {
		<-ctx.Done()

		return false, fmt.Errorf("node %q: upgrade to %s: %w", ip, image, status.FromContextError(ctx.Err()).Err())
	}

	if after == nil && breaks {
		after = status.Error(codes.Unavailable, "error reading from server: read tcp: connection reset by peer")
	}

	return false, after
}

// legacyUpgrade is MachineService.Upgrade (osFaults.legacy).
func (o *fakeOS) legacyUpgrade(ctx context.Context, m *osMachine, ip, image string) (bool, error) {
	o.mu.Lock()
	locked, breaks, hook := m.rebooting, m.faults.installBreaks, o.onUpgrade
	o.mu.Unlock()

	var after error

	if hook != nil {
		skip, err := hook(ctx, m.name)
		if skip {
			return true, fmt.Errorf("node %q: upgrade to %s: %w", ip, image, err)
		}

		after = err
	}

	o.mu.Lock()

	if !locked {
		o.upgrades = append(o.upgrades, m.name+" "+image)
		m.staged, m.stagedImage = render.TagOf(image), image
		m.installed = talos.InstallSequence
		m.reboots-- // the sequence's own reboot, not a Reboot call
	}
	o.mu.Unlock()

	if !locked {
		// The sequence runs whatever becomes of the caller.
		if err := o.Reboot(context.WithoutCancel(ctx), ip); err != nil {
			return true, err
		}
	}

	if after == nil && breaks {
		after = fmt.Errorf("node %q: upgrade: %w", ip, status.Error(codes.Unavailable, "error reading from server: read tcp: connection reset by peer"))
	}

	return true, after
}

// InstallEvidence is machined's log of the installs of the current boot.
func (o *fakeOS) InstallEvidence(ctx context.Context, ip string) (talos.Evidence, error) {
	m, err := o.reachable(ctx, ip)
	if err != nil {
		return talos.Evidence{}, fmt.Errorf("node %q: read machined's log: %w", ip, err)
	}

	o.mu.Lock()
	slow := m.faults.logSlow
	o.mu.Unlock()

	if slow {
		<-ctx.Done()

		return talos.Evidence{}, fmt.Errorf("node %q: read machined's log: %w", ip, status.FromContextError(ctx.Err()).Err())
	}

	o.mu.Lock()
	defer o.mu.Unlock()

	switch {
	case m.installing:
		return talos.Evidence{State: talos.InstallRunning, Image: m.image}, nil
	case m.faults.logRolled && m.installed == talos.InstallNone:
		return talos.Evidence{State: talos.InstallUnknown}, nil
	case m.installed == talos.InstallNone || m.installed == talos.InstallUnknown:
		return talos.Evidence{State: m.installed}, nil
	}

	return talos.Evidence{State: m.installed, Image: m.image}, nil
}

// Reboot reboots the machine into its staged version: it goes down at once
// (or after rebootLag, as Talos does while it shuts down) and boots after
// rebootDelay.
func (o *fakeOS) Reboot(ctx context.Context, ip string) error {
	m, err := o.reachable(ctx, ip)
	if err != nil {
		return fmt.Errorf("node %q: reboot: %w", ip, err)
	}

	o.mu.Lock()
	if m.rebooting {
		o.mu.Unlock()

		return fmt.Errorf("node %q: reboot: %w", ip, status.Error(codes.FailedPrecondition, "a reboot is already in progress"))
	}

	staged, lag := m.staged, m.faults.rebootLag
	if staged == "" {
		staged = m.version
	}

	m.rebooting = true
	m.reboots++
	o.mu.Unlock()

	if n := o.f.workloadsOn(m.name); n != 0 {
		o.mu.Lock()
		m.rebootedWithPods += n
		o.mu.Unlock()
	}

	o.wg.Add(1)

	if lag == 0 {
		o.goDown(m)

		go o.boot(m, staged)

		return nil
	}

	go func() {
		select {
		case <-o.done:
			o.wg.Done()

			return
		case <-time.After(lag):
		}

		o.goDown(m)
		o.boot(m, staged)
	}()

	return nil
}

// goDown takes a machine down for its reboot: its API and its Node's Ready
// go.
func (o *fakeOS) goDown(m *osMachine) {
	o.mu.Lock()
	m.up = false
	o.mu.Unlock()

	o.setNode(m.name, func(n *corev1.Node) {
		n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionFalse, Reason: "KubeletNotReady", Message: "node is shutting down"}}
	})
}

// boot brings a machine up after rebootDelay (and while it never boots,
// not at all) with a new boot ID, on staged unless it falls back.
func (o *fakeOS) boot(m *osMachine, staged string) {
	defer o.wg.Done()

	for first := true; ; first = false {
		wait := time.Millisecond
		if first {
			wait = o.rebootDelay
		}

		select {
		case <-o.done:
			return
		case <-time.After(wait):
		}

		o.mu.Lock()
		never := m.faults.neverBoots
		o.mu.Unlock()

		if !never {
			break
		}
	}

	o.mu.Lock()
	switch {
	case m.faults.bootsVersion != "":
		m.version = m.faults.bootsVersion
	case !m.faults.abFallback:
		m.version = staged
		if m.stagedImage != "" {
			m.runs.Extensions = carriedBy(m.stagedImage, m.runs.Extensions)
		}
	}

	m.stagedImage = ""

	m.boots++
	m.bootID = fmt.Sprintf("boot-%s-%d", m.name, m.boots)
	m.staged, m.installed, m.rebooting, m.image = "", talos.InstallNone, false, ""
	m.bootedAt = time.Now()
	m.up = true
	version, notReady := m.version, m.faults.stayNotReady
	o.reboots = append(o.reboots, m.name+" "+version)
	o.mu.Unlock()

	o.setNode(m.name, func(n *corev1.Node) {
		n.Status.NodeInfo.OSImage = fmt.Sprintf("Talos (%s)", version)
		if !notReady {
			n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}
		}
	})
}

// carriedBy is what a node running exts runs after booting image, as on
// Talos (and the simulator): the factory installer of its schematic keeps
// them, one of another schematic carries that schematic (what else it has
// is not known here), any other installer carries none.
func carriedBy(image string, exts []talos.Extension) []talos.Extension {
	schematic, base, ok := stages.FactorySchematic(image)
	if !ok {
		return nil
	}

	for _, e := range exts {
		if e.Name == "schematic" && e.Version == schematic {
			return exts
		}
	}

	return []talos.Extension{{Name: "schematic", Version: schematic, Author: "Image Factory (https://" + base + ")"}}
}
