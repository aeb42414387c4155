package datapath

// HideTCX makes tc attach as on a kernel without tcx (a clsact filter) until
// the returned function runs.
func HideTCX() (restore func()) {
	saved := haveTCX
	haveTCX = func() bool { return false }
	return func() { haveTCX = saved }
}
