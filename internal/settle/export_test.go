package settle

// Marked is how many grants w remembers settling of entries still pending
// to it (Worker.marks).
func Marked(w *Worker) int { return w.marks.count() }
