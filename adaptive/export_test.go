package adaptive

// RaceOn tells the external tests whether the race detector is on.
const RaceOn = raceOn
