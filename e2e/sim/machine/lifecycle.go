package machine

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/siderolabs/talos/pkg/machinery/resources/runtime"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ichor-dev/kubectl-ichor/e2e/sim/events"
)

// talosTag matches the tag of a Talos installer image.
var talosTag = regexp.MustCompile(`^v\d+\.\d+\.\d+(-[0-9A-Za-z.-]+)?$`)

// InstallerVersion returns the Talos version an installer image installs:
// its tag, e.g. "v1.13.9" for ghcr.io/siderolabs/installer:v1.13.9 or
// factory.talos.dev/installer/<schematic>:v1.13.9 (a digest is ignored).
func InstallerVersion(image string) (string, error) {
	ref := image
	if i := strings.Index(ref, "@"); i >= 0 {
		ref = ref[:i]
	}
	i := strings.LastIndex(ref, ":")
	if i < 0 || i < strings.LastIndex(ref, "/") {
		return "", fmt.Errorf("installer image %q has no tag", image)
	}
	tag := ref[i+1:]
	if !talosTag.MatchString(tag) {
		return "", fmt.Errorf("installer image %q: tag %q is not a Talos version like v1.13.9", image, tag)
	}
	return tag, nil
}

// Pull pulls an image into a namespace of the machine's store, as Talos'
// ImageService.Pull (and MachineService.ImagePull) does with containerd: an
// image already in the store is not pulled again; any other takes
// PullLatency and is stored if the registries serve it (images.go), else
// fails NotFound "error pulling image: ...". Under faults.PullFails every
// pull fails so. It returns the image's name as Talos reports it
// (normalized: registry, path and tag; Talos also pins a digest the
// simulator does not have).
func (m *Machine) Pull(ctx context.Context, ns, ref string) (string, error) {
	name, err := m.pull(ctx, ns, ref)
	var nf *imageNotFoundError
	if errors.As(err, &nf) {
		return "", status.Errorf(codes.NotFound, "error pulling image: %s", nf)
	}
	return name, err
}

// pull is Pull, returning the normalized reference pulled; a reference no
// registry serves is an *imageNotFoundError, one that does not parse a
// gRPC Unknown error (containerd's parser's, which Talos returns as is).
func (m *Machine) pull(ctx context.Context, ns, ref string) (string, error) {
	if !m.isUp() {
		return "", m.errDown()
	}
	if ref == "" {
		return "", status.Error(codes.InvalidArgument, "image reference is required")
	}
	r, err := parseImageRef(ref)
	if err != nil {
		return "", status.Error(codes.Unknown, err.Error())
	}
	name := r.String()
	if m.faults().PullFails {
		m.log.Info("image pull fails (fault)", "image", name)
		return "", &imageNotFoundError{ref: name}
	}
	if m.hasImage(ns, name) {
		return name, nil
	}
	select {
	case <-time.After(m.opts.PullLatency):
	case <-ctx.Done():
		return "", status.FromContextError(ctx.Err()).Err()
	}
	if !m.isUp() {
		return "", m.errDown()
	}
	if err := published(r, m.opts.Faults.Unpublished(), m.opts.Mirror); err != nil {
		m.log.Info("image pull: not found", "image", name)
		return "", err
	}
	m.storeImage(ns, name)
	return name, nil
}

// StageUpgrade installs the Talos version of an installer image into the
// inactive boot slot, as LifecycleService.Upgrade does: the machine keeps
// running its version and takes the new one on its next reboot. As on
// Talos, the installer must be in the store's namespace ns already (a
// client pulls it first: talosctl upgrade, ichor); one that is not fails
// the call with Internal "upgrade failed: installer image %q not found in
// containerd store: ..." (internal/app/lifecycle/container.go), after
// machined logged the upgrade's start. The install itself takes
// PullLatency. progress receives the progress messages.
func (m *Machine) StageUpgrade(ctx context.Context, ns, image string, progress func(msg string) error) error {
	if progress == nil {
		progress = func(string) error { return nil }
	}
	if !m.isUp() {
		return m.errDown()
	}
	version, err := InstallerVersion(image)
	if err != nil {
		return status.Error(codes.InvalidArgument, err.Error())
	}
	// One install at a time, as Talos' lifecycle service locks.
	m.mu.Lock()
	if m.installing {
		m.mu.Unlock()
		return status.Error(codes.FailedPrecondition, "another installation/upgrade is already in progress")
	}
	m.installing = true
	running := m.st.TalosVersion
	m.mu.Unlock()
	detached := false
	defer func() {
		if detached {
			return // the installer's goroutine ends the install
		}
		m.mu.Lock()
		m.installing = false
		m.mu.Unlock()
	}()
	m.logInstall(running, "start", image)
	if r, err := parseImageRef(image); err != nil || !m.hasImage(ns, r.String()) {
		return status.Error(codes.Internal, fmt.Sprintf("upgrade failed: installer image %q not found in containerd store: image %q: not found", image, image))
	}
	if err := progress(fmt.Sprintf("installing Talos %s from %s into the inactive boot slot", version, image)); err != nil {
		return err
	}
	// The installer container is created on the call's context: a caller
	// gone before it starts leaves nothing installed (machined logs the
	// failure), and that attempt is no install.
	select {
	case <-time.After(m.opts.PullLatency):
	case <-ctx.Done():
		m.logInstall(running, "failed", image)
		return status.FromContextError(ctx.Err()).Err()
	}
	// Talos waits for the installer container on a context detached from
	// the call's (internal/app/lifecycle/container.go: task.Wait(detachedCtx)):
	// once started, the install runs to its end and machined logs it, whether
	// or not the caller is still there to hear it.
	m.opts.Events.Start(m.opts.Name, events.TalosInstall, version)
	detached = true
	done := make(chan error, 1)
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		done <- m.runInstaller(running, image, version)
	}()
	select {
	case err := <-done:
		if err != nil {
			return err
		}
	case <-ctx.Done():
		return status.FromContextError(ctx.Err()).Err()
	}
	return progress(fmt.Sprintf("Talos %s installed: it boots on the next reboot", version))
}

// runInstaller is the installer container of a lifecycle upgrade: it takes
// faults.InstallTakes (0: at once), then writes version into the inactive
// boot slot and machined logs the end; it ends the install under way.
func (m *Machine) runInstaller(running, image, version string) error {
	defer func() {
		m.mu.Lock()
		m.installing = false
		m.mu.Unlock()
		m.notify()
	}()
	if d := m.faults().InstallTakes.Duration; d > 0 {
		m.log.Info("the install takes a while (fault)", "took", d)
		select {
		case <-time.After(d):
		case <-m.ctx.Done():
			return m.ctx.Err()
		}
	}
	m.opMu.Lock()
	m.mu.Lock()
	up := m.st.Up
	if up {
		m.st.StagedVersion = version
		m.st.InstallerImage = image
		m.st.StagedExtensions = installerExtensions(image, m.st.Extensions)
	}
	m.mu.Unlock()
	m.opMu.Unlock()
	if !up {
		return m.errDown()
	}
	m.log.Info("upgrade staged", "version", version, "image", image)
	m.logInstall(running, "done", image)
	return nil
}

// logInstall writes an install's start or end to machined's log as the
// running Talos' lifecycle service does (internal/app/lifecycle/lifecycle.go):
// 1.13 with log.Printf, under machined's "[talos] " prefix and the standard
// date ("starting upgrade: installer_image=<image>, disk=/dev/sda"); 1.14
// with machined's zap logger, whose console encoder writes the ISO 8601
// time, the coloured level, the message and the fields as spaced JSON
// ("starting upgrade {"component": "machined", "service": "lifecycle",
// "installer_image": "<image>", "disk": "/dev/sda"}").
func (m *Machine) logInstall(running, what, image string) {
	if talosMinor(running) < 14 {
		switch what {
		case "start":
			m.logMachined(fmt.Sprintf("starting upgrade: installer_image=%s, disk=%s", image, systemDisk))
		case "done":
			m.logMachined("upgrade completed successfully: exit_code=0")
		default:
			m.logMachined("upgrade failed: exit_code=1")
		}
		return
	}
	switch what {
	case "start":
		m.logZap("INFO", "starting upgrade", fmt.Sprintf(`"installer_image": %q, "disk": %q`, image, systemDisk))
	case "done":
		m.logZap("INFO", "upgrade completed", `"exit_code": 0`)
	default:
		m.logZap("WARN", "upgrade failed", `"exit_code": 1`)
	}
}

// systemDisk is the disk Talos is installed on, as the install lines name it.
const systemDisk = "/dev/sda"

// zapLevelColors are the ANSI colours of zap's CapitalColorLevelEncoder,
// which machined's logger uses (logging.WithColoredLevels).
var zapLevelColors = map[string]int{"INFO": 34, "WARN": 33, "ERROR": 31}

// logZap appends a line of the lifecycle service's zap logger to machined's
// log (Talos 1.14): fields are the spaced JSON fields after the logger's own.
func (m *Machine) logZap(level, msg, fields string) {
	line := fmt.Sprintf("%s \x1b[%dm%s\x1b[0m %s {\"component\": \"machined\", \"service\": \"lifecycle\", %s}",
		time.Now().UTC().Format("2006-01-02T15:04:05.000Z0700"), zapLevelColors[level], level, msg, fields)
	m.mu.Lock()
	defer m.mu.Unlock()
	m.machinedLog = append(m.machinedLog, line)
}

// logMachined appends a line to machined's log of this boot as machined's
// log.Printf writes it ("[talos] 2006/01/02 15:04:05 <line>").
func (m *Machine) logMachined(line string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.machinedLog = append(m.machinedLog, fmt.Sprintf("[talos] %s %s", time.Now().UTC().Format("2006/01/02 15:04:05"), line))
}

// MachinedLog returns machined's log of the current boot, one line per
// message, as talosctl logs machined reads it.
func (m *Machine) MachinedLog() ([]byte, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.st.Up {
		return nil, m.errDown()
	}
	return []byte(strings.Join(m.machinedLog, "\n") + "\n"), nil
}

// Reboot starts a reboot and returns at once: the machine goes down for
// RebootDelay and comes back with a new boot ID, running the staged version
// if an upgrade staged one (unless faults.ABFallback, which boots the old
// version again, or faults.NeverBoots, which keeps it down while set). Like
// Talos' reboot sequence, it does not drain the node. As Talos runs it in
// the background, a reboot or upgrade sequence already under way leaves the
// call its answer: the new reboot is the one under way (Talos lets a reboot
// take over a reboot) or fails on the lock ("reboot failed: locked": it
// cannot take over an upgrade).
func (m *Machine) Reboot() error { return m.RebootBy("") }

// RebootBy is Reboot asked by a call that answered with actor: the
// sequence's runtime events carry it (runtime_events.go).
func (m *Machine) RebootBy(actor string) error {
	m.logMachined("reboot via API received")
	m.mu.Lock()
	busy := m.st.Up && m.rebooting
	m.mu.Unlock()
	if busy {
		m.logMachined("reboot failed: locked")
		m.lockedSequence("reboot")
		return nil
	}
	return m.startSequence(sequenceEvents{m: m, name: "reboot", actor: actor}, false, nil)
}

// Rollback is MachineService.Rollback as Talos runs it (v1alpha1_server.go
// Rollback, the bootloader's Revert): the other boot slot is made the
// default again, then the machine reboots. With an install staged in this
// boot (the default already flipped to it), the other slot is the running
// one: the machine reboots into the Talos it runs and the staged install is
// dropped (a new install then writes the inactive slot afresh). With none,
// it boots the previous version (a real rollback); with no previous slot
// Talos refuses ("cannot rollback to ..., label does not exist").
func (m *Machine) Rollback() error {
	m.logMachined("rollback via API received")
	m.opMu.Lock()
	m.mu.Lock()
	switch {
	case !m.st.Up:
		m.mu.Unlock()
		m.opMu.Unlock()
		return m.errDown()
	case m.st.StagedVersion != "":
		m.log.Info("rollback: the staged install dropped, rebooting into the running version", "staged", m.st.StagedVersion, "running", m.st.TalosVersion)
		m.st.StagedVersion, m.st.StagedExtensions = "", nil
	case m.st.PreviousVersion != "":
		m.log.Info("rollback: rebooting into the previous version", "previous", m.st.PreviousVersion)
		m.st.StagedVersion, m.st.StagedExtensions = m.st.PreviousVersion, m.st.PreviousExtensions
	default:
		m.mu.Unlock()
		m.opMu.Unlock()
		return status.Error(codes.Unknown, `cannot rollback to "", label does not exist`)
	}
	m.mu.Unlock()
	m.opMu.Unlock()
	m.notify()
	return m.startSequence(sequenceEvents{m: m, name: "reboot"}, false, nil)
}

// startSequence starts a reboot sequence in the background: drain (when
// drain), before (when non-nil; an error aborts the sequence and the machine
// stays up), down, boot. seq publishes its runtime events.
func (m *Machine) startSequence(seq sequenceEvents, drain bool, before func(ctx context.Context) error) error {
	m.mu.Lock()
	if !m.st.Up {
		m.mu.Unlock()
		return m.errDown()
	}
	if m.rebooting {
		m.mu.Unlock()
		return status.Errorf(codes.FailedPrecondition, "node %s: a reboot or upgrade is already in progress", m.opts.Name)
	}
	m.rebooting = true
	m.mu.Unlock()
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		m.runSequence(seq, drain, before)
	}()
	return nil
}

func (m *Machine) runSequence(seq sequenceEvents, drain bool, before func(ctx context.Context) error) {
	ctx := m.ctx
	seq.start()
	if drain {
		seq.phase("drain", "cordonAndDrainNode")
		if m.opts.BeforeReboot != nil {
			dctx, cancel := context.WithTimeout(ctx, drainTimeout)
			if err := m.opts.BeforeReboot(dctx); err != nil {
				m.log.Warn("cordon and drain before reboot failed", "err", err)
			}
			cancel()
		}
	}
	if before != nil {
		if err := before(ctx); err != nil {
			m.log.Error("upgrade failed, not rebooting", "err", err)
			seq.failed(err)
			m.mu.Lock()
			m.rebooting = false
			m.mu.Unlock()
			m.notify()
			return
		}
		seq.phase("upgrade", "upgrade")
	}
	seq.shutdown()
	if err := m.goDown(ctx); err != nil {
		m.log.Error("shutdown", "err", err)
	}
	select {
	case <-time.After(m.opts.RebootDelay):
	case <-ctx.Done():
		return
	}
	if m.opts.PowerCycle != nil {
		if err := m.opts.PowerCycle(ctx); err != nil {
			m.log.Error("power cycle", "err", err)
		}
	}
	m.installStaged(ctx)
	for m.State().StagedVersion != "" && m.faults().NeverBoots {
		select {
		case <-time.After(faultPollInterval):
		case <-ctx.Done():
			return
		}
	}

	m.opMu.Lock()
	defer m.opMu.Unlock()
	m.mu.Lock()
	m.rebooting = false
	m.mu.Unlock()
	m.bootNext(ctx)
}

// bootNext boots the machine after it was down (a reboot, a power cycle):
// into the staged Talos version if an upgrade staged one (unless
// faults.ABFallback), with a config applied in STAGED mode made active. The
// caller holds opMu.
func (m *Machine) bootNext(ctx context.Context) {
	m.mu.Lock()
	if staged := m.st.StagedVersion; staged != "" {
		if m.faults().ABFallback {
			m.log.Info("upgrade boot failed, falling back to the previous boot slot (fault)", "version", m.st.TalosVersion, "staged", staged)
		} else {
			m.st.PreviousVersion, m.st.PreviousExtensions = m.st.TalosVersion, m.st.Extensions
			m.st.TalosVersion = staged
			m.st.Extensions = m.st.StagedExtensions
		}
		m.st.StagedVersion = ""
		m.st.StagedExtensions = nil
	}
	next, configStaged := m.persistent, m.st.ConfigStaged
	m.mu.Unlock()
	if configStaged {
		if err := m.setActiveConfig(ctx, next); err != nil {
			m.log.Error("apply staged config at boot", "err", err)
		}
	}
	if err := m.boot(ctx); err != nil {
		m.log.Error("boot", "err", err)
	}
}

// goDown takes the machine down as Talos' reboot sequence does: the stage
// rebooting, the services stopped (their resources destroyed), then the API,
// kubelet and static pods gone.
func (m *Machine) goDown(ctx context.Context) error {
	m.setStage(ctx, runtime.MachineStageRebooting)
	m.log.Info("rebooting")
	if err := m.stopServices(ctx); err != nil {
		return err
	}
	m.mu.Lock()
	m.st.Up = false
	m.kubelet = KubeletView{}
	m.mu.Unlock()
	m.endBootEvents()
	m.notify()
	return nil
}
