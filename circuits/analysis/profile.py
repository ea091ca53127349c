def profile(*a, **k): raise NotImplementedError
class Profile: pass
