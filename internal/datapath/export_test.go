package datapath

// HideTCX makes tc attach as on a kernel without tcx (a clsact filter) until
// the returned function runs.
func HideTCX() (restore func()) {
	saved := haveTCX
	haveTCX = func() bool { return false }
	return func() { haveTCX = saved }
}

// SmallWriteWindow makes writeArray map 64 KiB at a time, so that tables of
// a few MB take many windows, until the returned function runs.
func SmallWriteWindow() (restore func()) {
	saved := writeWindow
	writeWindow = 64 << 10
	return func() { writeWindow = saved }
}
