package testproc

import (
	"os/exec"
	"syscall"
)

// dieWithParent makes the server exit if the test process dies without
// cleaning up (killed, or a fuzz worker stopped by its coordinator). It
// keeps the rest of cmd's SysProcAttr (a Credential to run as).
func dieWithParent(cmd *exec.Cmd) {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = new(syscall.SysProcAttr)
	}
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
}
