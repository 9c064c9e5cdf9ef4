package talosnode

import (
	"context"
	"fmt"
	"net"
	"runtime"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// listenIn opens a TCP listener on addr inside the network namespace of the
// container's init process. The socket stays in that namespace after the
// thread returns to its own, so connections to addr from the container's
// network (its node IP, or its loopback) reach this process. Needs
// CAP_SYS_ADMIN (root).
func listenIn(ctx context.Context, container, addr string) (net.Listener, error) {
	pid, err := containerPID(ctx, container)
	if err != nil {
		return nil, err
	}
	target, err := unix.Open("/proc/"+strconv.Itoa(pid)+"/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("network namespace of %s: %w", container, err)
	}
	defer unix.Close(target)

	type result struct {
		lis net.Listener
		err error
	}
	done := make(chan result, 1)
	// A goroutine of its own, its thread locked: if the thread cannot
	// return to the host's namespace, it exits with the goroutine (never
	// unlocked) and no other goroutine runs in the node's namespace.
	go func() {
		runtime.LockOSThread()
		self, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			done <- result{err: fmt.Errorf("own network namespace: %w", err)}
			return
		}
		defer unix.Close(self)
		if err := unix.Setns(target, unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			done <- result{err: fmt.Errorf("enter the network namespace of %s: %w", container, err)}
			return
		}
		lis, lerr := net.Listen("tcp", addr)
		if err := unix.Setns(self, unix.CLONE_NEWNET); err != nil {
			if lis != nil {
				_ = lis.Close()
			}
			done <- result{err: fmt.Errorf("leave the network namespace of %s: %w", container, err)}
			return
		}
		runtime.UnlockOSThread()
		if lerr != nil {
			lerr = fmt.Errorf("listen on %s in %s: %w", addr, container, lerr)
		}
		done <- result{lis: lis, err: lerr}
	}()
	r := <-done
	return r.lis, r.err
}

// containerPID is the host PID of the container's init process.
func containerPID(ctx context.Context, container string) (int, error) {
	out, err := docker(ctx, nil, "inspect", "-f", "{{.State.Pid}}", container)
	if err != nil {
		return 0, err
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(out)))
	if err != nil || pid <= 0 {
		return 0, fmt.Errorf("docker inspect %s: no running process (pid %q)", container, strings.TrimSpace(string(out)))
	}
	return pid, nil
}
