package testproc

import (
	"os/exec"
	"syscall"
)

// dieWithParent makes the server exit if the test process dies without
// cleaning up (killed, or a fuzz worker stopped by its coordinator).
func dieWithParent(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
